"""NVFP4Linear's tiled weight layout (ops/nvfp4_gemv/tiled_layout.py; the mma kernel in tiled.py): the layout itself,
the module's plain-layout state, and (GPU) the tiled mma kernel against the fp32 reference."""
import pytest
import torch

from llmkernels import NVFP4Linear, nvfp4_quantize
from llmkernels.checking import graph_replay, rel_err
from llmkernels.ops.nvfp4.reference import nvfp4_linear_ref
from llmkernels.ops.nvfp4.spec import LINEAR_TOL, random_scales
from llmkernels.ops.nvfp4.tiled import tiled_launch
from llmkernels.ops.nvfp4.tiled_layout import (PAIR_MASK, REST_MASK, REST_MUL, code_bits, tile_packed,
                                                    tile_scales, tileable, untile_packed, untile_scales)


def _weights(N, K, dev):
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)  # every code, both signs
    s = random_scales((N, K // 16), dev, 0x08, 0x60)
    return w, s


def test_layout_matches_its_definition():
    N, K = 48, 768
    w, s = _weights(N, K, "cpu")
    wp, sp = tile_packed(w), tile_scales(s)
    assert wp.shape == w.shape and wp.dtype == w.dtype and sp.shape == s.shape and sp.dtype == s.dtype
    words = w.view(torch.int64)  # [N, K/16]: word kw of row r
    tw = wp.view(torch.int64).view(N // 16, K // 64, 32, 2)
    ts = sp.view(torch.uint8).view(N // 16, K // 256, 32, 8)
    su = s.view(torch.uint8)
    for r in range(N):
        b, g, h = r // 16, r % 8, (r % 16) // 8
        for kw in range(K // 16):
            lane = 4 * g + kw % 4
            assert tw[b, kw // 4, lane, h] == _permuted(int(words[r, kw]))
            assert ts[b, kw // 16, lane, 2 * ((kw // 4) % 4) + h] == su[r, kw]
    assert torch.equal(untile_packed(wp), w) and torch.equal(untile_scales(sp).view(torch.uint8), su)


def _permuted(word: int) -> int:
    """A plain word (code k at bits 4k..4k+3) with its bits moved to code_bits, as a signed int64."""
    out = 0
    for k in range(16):
        for i, b in enumerate(code_bits(k)):
            out |= ((word >> (4 * k + i)) & 1) << b
    return out - (1 << 64) if out >> 63 else out


def test_code_bits_cover_the_word():
    assert sorted(b for k in range(16) for b in code_bits(k)) == list(range(64))


def _bf16_pair(word: int, p: int) -> int:
    """The kernel's decode of pair p (tiled._asm_mma_tiled), emulated on Python ints: funnel shift + AND, or AND,
    multiply, AND."""
    word &= (1 << 64) - 1
    lo, hi = word & 0xFFFFFFFF, word >> 32
    if p < 6:
        rot = ((word >> (3 * (p % 3))) | (word << (64 - 3 * (p % 3)))) & ((1 << 64) - 1)
        src = rot & 0xFFFFFFFF if p < 3 else rot >> 32
        return src & PAIR_MASK
    return (((lo if p == 6 else hi) & REST_MASK) * REST_MUL) & 0xFFFFFFFF & PAIR_MASK


def test_decode_recipe_gives_e2m1_in_bf16_fields():
    """Every pair of every code: the decoded 32 bits are two bf16 E2M1 x 2^-126 (sign 15, magnitude at 6-8), the
    pair's first code in the low half (the mma's even k), whatever the other 14 codes hold."""
    g = torch.Generator().manual_seed(3)
    for _ in range(64):
        codes = torch.randint(0, 16, (16,), generator=g).tolist()
        word = sum(c << (4 * k) for k, c in enumerate(codes))
        tw = _permuted(word)
        for p in range(8):
            want = 0
            for half, c in enumerate(codes[2 * p:2 * p + 2]):
                want |= (((c & 7) << 6) | ((c >> 3) << 15)) << (16 * half)
            assert _bf16_pair(tw, p) == want, (codes, p)
    # the bf16 bits read as E2M1 x 2^-126 for all 16 codes
    vals = torch.tensor([((c & 7) << 6) - (c >> 3 << 15) for c in range(16)], dtype=torch.int16)  # sign bit: int16 < 0
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6] * 2) * torch.tensor([1.0] * 8 + [-1.0] * 8)
    assert torch.equal(vals.view(torch.bfloat16).double() * 2.0 ** 126, e2m1.double())


def test_tileable():
    assert tileable(16, 256) and tileable(4096, 14336)
    assert not tileable(24, 256) and not tileable(16, 272) and not tileable(0, 256)


def test_module_state_is_plain(device):
    lin = torch.nn.Linear(512, 48, bias=True).to(device)
    q = NVFP4Linear.from_linear(lin)
    assert q.tiled and "tiled=True" in repr(q)
    packed, scales, gs = nvfp4_quantize(lin.weight.detach())
    sd = q.state_dict()
    assert torch.equal(sd["packed"], packed) and torch.equal(sd["scales"].view(torch.uint8), scales.view(torch.uint8))
    assert not torch.equal(q.packed, packed)  # the buffer holds the tiled bytes
    p2, s2 = q.plain_weight()
    assert torch.equal(p2, packed) and torch.equal(s2.view(torch.uint8), scales.view(torch.uint8))
    # a plain state dict loads into a tiled module, and the forward is the reference on the plain weights
    q2 = NVFP4Linear(512, 48, bias=True, device=device)
    q2.load_state_dict(sd)
    assert torch.equal(q2.packed, q.packed) and torch.equal(q2.state_dict()["packed"], packed)
    x = torch.randn(3, 512, device=device).half()
    ref = nvfp4_linear_ref(x, packed, scales, q.global_scale, q.bias)
    assert rel_err(q2(x), ref) <= LINEAR_TOL[torch.float16]
    # a wrong shape is load_state_dict's own error, not a crash in the layout change
    bad = dict(sd, packed=sd["packed"][:, :-1])
    with pytest.raises(RuntimeError, match="size mismatch"):
        q2.load_state_dict(bad)


def test_module_not_tileable_stays_plain(device):
    q = NVFP4Linear(272, 40, bias=False, device=device)
    assert not q.tiled and q.plain_weight()[0] is q.packed


def test_set_weight_checks_shapes(device):
    q = NVFP4Linear(256, 16, bias=False, device=device)
    w, s = _weights(16, 256, device)
    with pytest.raises(ValueError, match="packed"):
        q.set_weight(w[:, :-1], s)
    with pytest.raises(TypeError, match="scales"):  # a float copy_ would convert values, not bytes
        q.set_weight(w, s.view(torch.uint8))
    with pytest.raises(TypeError, match="packed"):
        q.set_weight(w.float(), s)
    q.set_weight(w, s)
    assert torch.equal(q.plain_weight()[0], w)


def test_module_bad_x(device):
    q = NVFP4Linear(256, 16, bias=False, device=device)
    with pytest.raises(ValueError, match="in_features=256"):
        q(torch.randn(2, 128, device=device).half())
    with pytest.raises(TypeError, match="x"):
        q(torch.randn(2, 256, device=device))


def test_module_replaced_buffers_are_checked(device):
    q = NVFP4Linear(256, 32, bias=False, device=device)
    x = torch.randn(2, 256, device=device).half()
    q(x)  # cached plan for this key
    q.scales = torch.zeros(32, 8, dtype=torch.float8_e4m3fn, device=device)  # wrong shape: a new key, checked
    with pytest.raises(ValueError, match="scales"):
        q(x)
    q.scales = torch.zeros(32, 16, dtype=torch.float8_e4m3fn, device=device)
    q.bias = torch.zeros(64, device=device)[::2]  # a strided bias: the kernel would read it as contiguous
    with pytest.raises(ValueError, match="contiguous"):
        q(x)


def test_module_plan_not_reused_across_shapes(device):
    # the cached plan of one x shape / dtype / stride must not serve another
    q = NVFP4Linear(256, 32, bias=True, device=device)
    w, s = _weights(32, 256, device)
    q.set_weight(w, s)
    q.bias.normal_()
    for x in (torch.randn(2, 256, device=device).half(), torch.randn(5, 256, device=device).half(),
              torch.randn(5, 256, device=device).bfloat16() if device.type == "cuda" else None,
              torch.randn(3, 512, device=device).half()[:, ::2], torch.randn(2, 3, 256, device=device).half()):
        if x is None:
            continue
        for _ in range(2):  # the first call checks and plans, the second takes the plan
            y = q(x)
            ref = nvfp4_linear_ref(x.reshape(-1, 256), w, s, q.global_scale, q.bias).reshape(*x.shape[:-1], 32)
            assert y.shape == ref.shape and rel_err(y, ref) <= LINEAR_TOL[x.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,N,K,cfg", [(1, 16, 256, {}), (3, 48, 512, {}), (8, 4096, 4096, {}),
                                       (9, 96, 1024, {}), (16, 1040, 4352, {}), (5, 4096, 14336, {}),
                                       (2, 64, 4096, {"KS": 16}), (4, 160, 2048, {"KS": 1, "R": 4}),
                                       (13, 512, 3584, {"KS": 2, "R": 1}), (16, 256, 8192, {"KS": 16}),
                                       (2, 64, 14336, {"KS": 16}), (3, 32, 768, {"KS": 4}),
                                       (11, 80, 1280, {"KS": 8, "loads": 1}), (1, 48, 4096, {"loads": 0}),
                                       (6, 96, 2304, {"KS": 4, "loads": 0}), (12, 64, 4096, {"loads": 2}),
                                       (1, 48, 4096, {"early": 0}), (4, 64, 2048, {"loads": 2, "early": 1})])
def test_gpu_tiled_kernel(dtype, T, N, K, cfg):
    # full-range codes and scales, NaN-poisoned output, strided x, bias; a wrong layout or fragment order would
    # mix rows, tokens or K ranges and miss the reference by far more than the tolerance
    _check_tiled_launch(lambda xs, w, s, gs, b, y: tiled_launch(xs, w, s.view(torch.uint8), gs, b, y, cfg=cfg),
                        dtype, T, N, K, 64)


@pytest.mark.gpu
def test_gpu_tiled_early_loads_chained():
    # weights loaded before griddepcontrol.wait: back-to-back launches (each released at the previous one's entry)
    # whose x is the previous call's y must still read that y only once written; loads 1 at T=1 loads early
    dev = torch.device("cuda")
    K = 256 * 4
    w, _ = _weights(K, K, dev)
    s = torch.full((K, K // 16), 0x38, dtype=torch.uint8, device=dev)  # e4m3 1.0
    # E2M1 codes have rms 2.93: gs = 1 / (2.93 sqrt(K)) keeps x's scale through the chain (no overflow to NaN)
    wt, st, gs = tile_packed(w), tile_scales(s), torch.full((1,), 1 / (2.93 * 32), device=dev)
    x0 = torch.randn(1, K, device=dev).bfloat16()
    outs = {}
    for early in (0, 1):
        x = x0
        for _ in range(20):
            x = tiled_launch(x, wt, st, gs, None, torch.empty_like(x), cfg={"early": early})
        outs[early] = x
    assert outs[0].isfinite().all() and outs[0].abs().max() > 1e-3
    assert torch.equal(outs[0], outs[1])


def _check_tiled_launch(go, dtype, T, N, K, pad):
    """go(x, packed, scales, gs, bias, y) on the tiled layout against the fp32 reference: full-range codes and
    scales, x rows strided by K + pad, a bias, y poisoned with NaN."""
    dev = torch.device("cuda")
    w, s = _weights(N, K, dev)
    xs = torch.randn(T, K + pad, device=dev).to(dtype)[:, :K]
    gs = torch.full((1,), 0.37, device=dev)
    bias = torch.randn(N, device=dev)
    y = torch.full((T, N), float("nan"), dtype=dtype, device=dev)
    go(xs, tile_packed(w), tile_scales(s), gs, bias, y)
    assert rel_err(y, nvfp4_linear_ref(xs, w, s, gs, bias)) <= LINEAR_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6, 16])
def test_gpu_tiled_kernel_8_byte_aligned_x(T):
    # rows 8- but not 16-byte aligned take the 8-byte activation loads; the module's plan is keyed on the alignment
    dev = torch.device("cuda")
    N, K = 96, 1024
    w, s = _weights(N, K, dev)
    xs = torch.randn(T, K + 68, device=dev).to(torch.bfloat16)[:, 4:K + 4]
    assert xs.data_ptr() % 16 == 8
    gs = torch.full((1,), 0.37, device=dev)
    ref = nvfp4_linear_ref(xs, w, s, gs, None)
    y = torch.full((T, N), float("nan"), dtype=torch.bfloat16, device=dev)
    tiled_launch(xs, tile_packed(w), tile_scales(s), gs, None, y)
    assert rel_err(y, ref) <= LINEAR_TOL[torch.bfloat16]
    q = NVFP4Linear(K, N, bias=False, device=dev)
    q.set_weight(w, s)
    q.global_scale.fill_(0.37)
    base = torch.randn(T, K + 68, device=dev).to(torch.bfloat16)
    for off in (0, 4, 0):  # 16-byte aligned, 8-byte aligned, then the first plan again
        x = base[:, off:K + off]
        assert rel_err(q(x), nvfp4_linear_ref(x, w, s, gs, None)) <= LINEAR_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,N,K,cfg,pad", [(17, 48, 512, {}, 32), (200, 1040, 768, {}, 64),
                                           (77, 4096, 4096, {"BT": 64}, 8), (300, 4096, 14336, {"BT": 128}, 32),
                                           (512, 2048, 4096, {"split": 3}, 0), (129, 160, 2048, {"BT": 256}, 32),
                                           (1000, 7168, 4096, {}, 0), (65, 16, 256, {}, 33),
                                           (300, 1200, 2048, {"NSM": 9}, 32), (512, 28672, 4096, {}, 0)])
def test_gpu_wgmma_prefill_kernel(dtype, T, N, K, cfg, pad):
    # the sm_90 Gluon kernel: rows past N and tokens past the tiles, every token tile, K splits, bias, strided x
    # (pad 33: an odd row stride, copied before the 4-byte permutation); the last wave's row tiles split (NSM 9: 20
    # tiles, the last row tile, rows past N, in 4 pieces; 28672 x 4096 at 512 tokens: 26 row tiles in 2 pieces)
    from llmkernels.ops.nvfp4.prefill_wgmma import wgmma_prefill_launch
    _check_tiled_launch(lambda *a: wgmma_prefill_launch(*a, cfg), dtype, T, N, K, pad)


@pytest.mark.gpu
def test_gpu_wgmma_prefill_unaligned_x():
    # a contiguous x starting 2 bytes past a 4-byte boundary: the 4-byte permutation works on an aligned copy
    from llmkernels.ops.nvfp4.prefill_wgmma import wgmma_prefill_launch
    dev = torch.device("cuda")
    T, N, K = 40, 64, 512
    w, s = _weights(N, K, dev)
    x = torch.randn(T * K + 1, device=dev).bfloat16()[1:].view(T, K)
    assert x.is_contiguous() and x.data_ptr() % 4 == 2
    gs = torch.full((1,), 0.37, device=dev)
    y = torch.full((T, N), float("nan"), dtype=torch.bfloat16, device=dev)
    wgmma_prefill_launch(x, tile_packed(w), tile_scales(s), gs, None, y)
    assert rel_err(y, nvfp4_linear_ref(x, w, s, gs, None)) <= LINEAR_TOL[torch.bfloat16]


def test_permute_x_is_the_fragment_order(device):
    # x' column 16 kk + 8 ph + 2 c + e of a step holds x column 16 c + 4 kk + 2 ph + e: the codes 2 p + e of word c
    # (pair p = 2 kk + ph) that the wgmma kernel's lane c puts in slot (ph) of k16 chunk kk
    from llmkernels.ops.nvfp4.prefill_wgmma import permute_x
    x = torch.arange(128, dtype=torch.float16, device=device).repeat(3, 1)
    xp = permute_x(x[:, :128], rows=20)  # padded to whole token tiles: rows past x's are zero (the TMA boxes)
    assert xp.shape == (20, 128) and not xp[3:].any() and (xp[0] == xp[2]).all()
    for kk in range(4):
        for ph in range(2):
            for c in range(4):
                for e in range(2):
                    for j in range(2):
                        assert xp[1, 64 * j + 16 * kk + 8 * ph + 2 * c + e] == 64 * j + 16 * c + 4 * kk + 2 * ph + e


def test_tiled_config():
    # (KS, R, iterations a warp, loads), as on an H100 (132 SMs)
    from llmkernels.ops.nvfp4.tiled import tiled_config

    def plan(T, N, K, **c):
        return tiled_config(T, N, K, torch.device("cpu"), {"NSM": 132, **c})

    assert plan(1, 28672, 4096) == (2, 1, 8, 1)  # one token: R 1 ...
    assert plan(1, 8192, 28672) == (8, 2, 14, 1)  # ... or 2 where KS >= 8 warps run >= 8 iterations each
    assert plan(1, 10240, 8192) == (8, 1, 4, 1)
    assert plan(16, 28672, 4096) == (2, 4, 8, 0)  # R doubled above 8 tokens: 224 programs of 8 warps, one wave
    assert plan(1, 57344, 8192) == (1, 1, 32, 1)  # 3584 blocks: ~1 warp a block fills the SMs
    assert plan(16, 10240, 8192) == (8, 1, 4, 0)  # R 2 would need 5120 warps: more than one wave
    assert plan(16, 4096, 14336) == (8, 2, 7, 0)
    assert plan(4, 4096, 14336) == (16, 1, 4, 0)  # 56 iterations in 16 ranges of 4: the last two empty
    assert plan(16, 4096, 4096, R=3) == (8, 3, 2, 0)
    with pytest.raises(ValueError, match="early"):
        plan(1, 4096, 4096, early=2)
    with pytest.raises(ValueError, match="NSM"):
        plan(1, 4096, 4096, NSM=0)


def test_wgmma_prefill_plan():
    # (BT, row tiles run whole, pieces of each later one, iterations a piece), as on an H100 (132 SMs)
    from llmkernels.ops.nvfp4 import prefill_wgmma as pw

    def plan(T, N, K, **c):
        return pw.wgmma_prefill_plan(T, N, K, torch.device("cpu"), {"NSM": 132, **c})

    assert plan(64, 28672, 4096)[0] == 64
    assert plan(1024, 28672, 4096) == (256, 224, 1, 16)  # 896 tiles: 6.8 waves, the last one too full to split
    # 448 tiles of 256 tokens: 3 waves + 52 tiles, whose 26 row tiles run in 2 pieces of K (104 programs)
    assert plan(512, 28672, 4096) == (256, 198, 2, 8)
    assert plan(512, 28672, 4096, tail=False) == (256, 224, 1, 16)
    assert plan(512, 4096, 14336) == (128, 32, 1, 56)  # 128 tiles of 128 tokens: one wave
    # BT 256 pads 300 tokens to 512, BT 128 to 384 (1.23x vs 1.41x cuBLAS's time on the H100); 900: 1024 either way
    assert plan(300, 28672, 4096)[0] == 128 and plan(640, 28672, 4096)[0] == 128
    assert plan(900, 28672, 4096)[0] == 256 and plan(1100, 28672, 4096)[0] == 256
    assert plan(64, 4096, 4096) == (64, 0, 4, 4)  # 32 tiles: every one in 4 pieces
    assert plan(512, 2048, 4096, split=3) == (128, 0, 3, 6)
    with pytest.raises(ValueError, match="BT"):
        plan(512, 4096, 4096, BT=32)


@pytest.mark.gpu
@pytest.mark.parametrize("T, kernel, cfg", [(4, "tiled", None), (40, "prefill", {"split": 2}), (40, "wgmma", None),
                                            (300, "wgmma", {"split": 2})])
def test_gpu_nan_scale_and_input(T, kernel, cfg):
    from llmkernels.ops.nvfp4.prefill_wgmma import wgmma_prefill_launch
    from llmkernels.ops.nvfp4.tiled_prefill import prefill_launch
    dev = torch.device("cuda")
    w, s = _weights(32, 512, dev)
    s = s.view(torch.uint8).clone()
    s[3, 5] = 0x7F  # e4m3 NaN: row 3 is NaN for every token
    x = torch.randn(T, 512, device=dev).bfloat16()
    x[2, 100] = float("nan")  # token 2 is NaN for every row
    y = torch.empty(T, 32, dtype=torch.bfloat16, device=dev)
    go = {"tiled": tiled_launch, "prefill": prefill_launch, "wgmma": wgmma_prefill_launch}[kernel]
    go(x, tile_packed(w), tile_scales(s), torch.ones(1, device=dev), None, y, cfg)
    assert torch.isnan(y[:, 3]).all() and torch.isnan(y[2]).all()
    ok = torch.ones_like(y, dtype=torch.bool)
    ok[:, 3], ok[2] = False, False
    assert not torch.isnan(y[ok]).any()


@pytest.mark.gpu
def test_gpu_tiled_module_graph_and_compile():
    dev = torch.device("cuda")
    lin = torch.nn.Linear(1024, 512, bias=True, device=dev)
    q = NVFP4Linear.from_linear(lin)
    x = torch.randn(4, 1024, device=dev).bfloat16()
    packed, scales = q.plain_weight()
    ref = nvfp4_linear_ref(x, packed, scales, q.global_scale, q.bias)
    y0 = q(x)
    assert rel_err(y0, ref) <= LINEAR_TOL[torch.bfloat16]
    for _ in range(2):  # [B, 1, K] as a model passes it: checked, then through the cached plan
        assert torch.equal(q(x.view(4, 1, 1024)).view(4, 512), y0)
    assert torch.equal(graph_replay(lambda: q(x)), y0)
    yc = torch.compile(q, fullgraph=True)(x)
    assert torch.equal(yc, y0)
    # 17+ tokens take the wgmma kernel on sm_90 (the prefill kernel / dequantize path elsewhere); graphs, compile
    for T in (40, 200):
        xp = torch.randn(T, 1024, device=dev).bfloat16()
        yp = q(xp)
        assert rel_err(yp, nvfp4_linear_ref(xp, packed, scales, q.global_scale, q.bias)) <= LINEAR_TOL[torch.bfloat16]
        assert torch.equal(graph_replay(lambda: q(xp)), yp) and torch.equal(torch.compile(q, fullgraph=True)(xp), yp)


@pytest.mark.gpu
@pytest.mark.parametrize("T, pad, off, dtype", [(40, 0, 0, torch.bfloat16), (300, 64, 0, torch.float16),
                                                (77, 0, 1, torch.bfloat16), (1100, 8, 0, torch.bfloat16)])
def test_gpu_module_prefill_plan(T, pad, off, dtype):
    # the module's prefill through its cached plan (sm_90: WgmmaPrefillPlan): the first call takes Triton's launch,
    # later ones the kept kernels; K splits (40, 77 tokens), strided rows, a start 2 bytes past alignment (copied)
    dev = torch.device("cuda")
    K = 1024
    q = NVFP4Linear.from_linear(torch.nn.Linear(K, 512, bias=True, device=dev))
    buf = torch.randn(T * (K + pad) + off, device=dev).to(dtype)
    x = buf[off:].view(T, K + pad)[:, :K]
    packed, scales = q.plain_weight()
    ref = nvfp4_linear_ref(x, packed, scales, q.global_scale, q.bias)
    ys = [q(x) for _ in range(3)]
    assert rel_err(ys[0], ref) <= LINEAR_TOL[dtype]
    assert torch.equal(ys[1], ys[0]) and torch.equal(ys[2], ys[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,N,K,cfg", [(17, 48, 512, {}), (33, 1040, 4352, {}), (100, 272, 1024, {"split": 3}),
                                       (128, 160, 2048, {"BT": 64}), (64, 96, 768, {"split": 1}),
                                       (20, 4096, 14336, {}), (129, 32, 256, {"BKW": 8, "num_warps": 4})])
def test_gpu_prefill_kernel(dtype, T, N, K, cfg):
    # full-range codes and scales, NaN-poisoned output, strided x, bias, rows and tokens past the tiles, K splits
    from llmkernels.ops.nvfp4.tiled_prefill import prefill_launch
    _check_tiled_launch(lambda *a: prefill_launch(*a, cfg), dtype, T, N, K, 32)


def test_dequant_reads_the_tiled_layout(device):
    from llmkernels.ops.nvfp4.linear import dequant_launch
    from llmkernels.ops.nvfp4.tiled_layout import dequant_tiled_launch
    N, K = 48, 768
    w, s = _weights(N, K, device)
    s = s.view(torch.uint8).clone()
    s[17, 9] = 0x7F  # a NaN scale: its 16 outputs are NaN in both layouts
    gs = torch.full((1,), 0.37, device=device)
    plain = torch.empty(N, K, dtype=torch.float16, device=device)
    tiled = torch.full((N, K), 1.0, dtype=torch.float16, device=device)
    dequant_launch(w, s, gs, plain)
    dequant_tiled_launch(tile_packed(w), tile_scales(s), gs, tiled)
    assert torch.equal(plain.isnan(), tiled.isnan()) and plain.isnan().sum() == 16
    assert torch.equal(plain.nan_to_num(), tiled.nan_to_num())


def test_module_prefill_reference(device):
    q = NVFP4Linear(512, 32, bias=True, device=device)
    w, s = _weights(32, 512, device)
    q.set_weight(w, s)
    q.bias.normal_()
    x = torch.randn(20, 512, device=device).half()
    assert rel_err(q(x), nvfp4_linear_ref(x, w, s, q.global_scale, q.bias)) <= LINEAR_TOL[torch.float16]


def test_pdl_release_rule():
    # no PDL off Hopper; on it the next kernel is released at entry below EARLY_RELEASE_BYTES of weights, else late
    from llmkernels.ops.nvfp4 import tiled
    assert tiled._pdl(torch.device("cpu"), 4096, 4096)["USE_GDC"] is False
    assert tiled._pdl(torch.device("cpu"), 4096, 4096)["TRIGGER"] == 1
    assert tiled._pdl(torch.device("cpu"), 28672, 4096)["TRIGGER"] == 2
    assert 10240 * 8192 // 2 < tiled.EARLY_RELEASE_BYTES <= 28672 * 4096 // 2
