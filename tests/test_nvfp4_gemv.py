import math

import pytest
import torch

from llmkernels import (NVFP4Linear, from_blocked, nvfp4_dequantize, nvfp4_gemv, nvfp4_linear, nvfp4_quantize,
                        to_blocked)
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4 import custom_kernel
from llmkernels.ops.nvfp4.format import E2M1_VALUES, pack_codes, unpack_e2m1
from llmkernels.ops.nvfp4.gemv import gemv_launch, gemv_plan, gemv_tile
from llmkernels.ops.nvfp4.linear import dequant_launch, linear_launch
from llmkernels.ops.nvfp4.reference import nvfp4_gemv_ref, nvfp4_linear_ref
from llmkernels.ops.nvfp4.spec import GEMV_TOL, LINEAR_TOL, make_inputs, make_linear_inputs, random_scales

GRID = torch.tensor(E2M1_VALUES[:8])


def _gemv(x, **kw):
    return nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], **kw)


def _ref(x, alpha=None):
    return nvfp4_gemv_ref(x["a"], x["b"], x["sfa"], x["sfb"], alpha)


def _codes_to_bytes(codes):
    """int codes [..., K] -> uint8 [..., K/2] (element 2i in the low nibble)."""
    return pack_codes(torch.as_tensor(codes))


# ---- format ------------------------------------------------------------------------------------

def test_e2m1_decode_all_bytes_and_nibble_order():
    b = torch.arange(256, dtype=torch.uint8)
    v = unpack_e2m1(b[None])[0]
    lut = torch.tensor(E2M1_VALUES)
    assert torch.equal(v[0::2], lut[b.long() & 15]) and torch.equal(v[1::2], lut[b.long() >> 4])
    assert unpack_e2m1(torch.tensor([[0x21]], dtype=torch.uint8)).tolist() == [[0.5, 1.0]]  # low nibble first
    assert _codes_to_bytes([[1, 2]]).tolist() == [[0x21]]
    f4 = torch.tensor([[0x21, 0xF9]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert unpack_e2m1(f4).tolist() == [[0.5, 1.0, -0.5, -6.0]]


def test_quantize_roundtrip_exact_when_representable():
    # every block holds a +-6 (so amax / 6 is the block scale exactly) and any other codes except -0
    N, K = 24, 96
    codes = torch.randint(0, 16, (N, K))
    codes[codes == 8] = 0
    codes[:, ::16] = torch.where(torch.rand(N, K // 16) < 0.5, 7, 15)
    scales = random_scales((N, K // 16), "cpu", 0x08, 0x7E)  # normal e4m3 values, 2^-6 .. 448
    packed = _codes_to_bytes(codes)
    w = nvfp4_dequantize(packed, scales)  # exact in fp32
    p2, s2, gs = nvfp4_quantize(w, global_scale=1.0)
    assert float(gs) == 1.0
    assert torch.equal(s2.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(p2, packed)
    assert torch.equal(nvfp4_dequantize(p2, s2, gs), w)


def test_quantize_ties_to_even_and_saturation():
    # global scale 1: block amax 6.375 -> scale 1.0625, a tie in e4m3 that rounds to even (1.0); 6.375 then
    # saturates to 6; the halfway points go to the even code; small negatives give +0, never -0
    w = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.375, -0.25, -0.75, -5.0, -0.1, 0.0, 0.3, 1.0, 2.0]])
    p, s, _ = nvfp4_quantize(w, global_scale=1.0)
    assert float(s.float()) == 1.0
    assert unpack_e2m1(p)[0].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0, -1.0, -4.0, 0.0, 0.0, 0.5,
                                          1.0, 2.0]
    assert int((p[0, 4] & 0xF)) == 0  # -0.25 encodes as code 0, not 8
    # a global scale too small for w: block scales saturate at e4m3's 448 (never NaN) and values clip to +-6
    big = torch.randn(4, 32) * 100
    p, s, g = nvfp4_quantize(big, global_scale=1e-3)
    assert torch.all(s.float() <= 448) and torch.all(s.float() == 448) and not s.float().isnan().any()
    d = nvfp4_dequantize(p, s, g)
    assert torch.isfinite(d).all() and d.abs().max() <= 6 * 448 * 1e-3 * (1 + 1e-6)


def test_quantize_error_bound():
    N, K = 40, 256
    w = torch.randn(N, K) * torch.logspace(-3, 1, N)[:, None]  # rows of very different magnitude
    w[3, 17] = 50.0  # an outlier
    p, s, gs = nvfp4_quantize(w.to(torch.bfloat16))
    w = w.to(torch.bfloat16).float()
    deq = nvfp4_dequantize(p, s, gs)
    # global scale puts the largest block scale at the top of e4m3
    assert float(s.float().max()) == 448.0 and math.isclose(float(gs), float(w.abs().max()) / (6 * 448), rel_tol=1e-6)
    # each value is the nearest point of its block's grid (scale * global_scale * {0, +-0.5, ..., +-6}),
    # except values beyond 6 * scale (scale rounded down), which saturate to +-6 * scale
    S = (s.float() * gs).repeat_interleave(16, dim=1)
    grid = torch.cat([GRID, -GRID])
    nearest = ((w[..., None] - grid * S[..., None]).abs()).amin(-1)
    slack = 1e-6 * w.abs() + 1e-30  # deq is (e2m1 * scale) * gs, the grid here e2m1 * (scale * gs): fp32 rounding
    assert torch.all((w - deq).abs() <= nearest + slack)
    # and within one grid unit S of w (the e2m1 spacing is <= 2, the saturation loss < 0.4 S, see format.py)
    assert torch.all((w - deq).abs() <= S + slack)
    # NVFP4 round trip of Gaussian data: ~9-10 % relative RMS error (3 significant bits per value)
    assert rel_err(deq, w) < 0.12


def test_to_blocked_matches_cublas_formula_and_inverts():
    R, C = 256, 8
    s = random_scales((R, C), "cpu")
    # the layout as the GPU MODE reference writes it (cuBLAS "block scaling factors layout")
    blocks = s.view(R // 128, 128, C // 4, 4).permute(0, 2, 1, 3)
    expected = blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()
    assert torch.equal(to_blocked(s).view(torch.uint8), expected.view(torch.uint8))
    for R, C in [(200, 7), (1, 1), (129, 4)]:  # padded sizes
        s = random_scales((R, C), "cpu")
        blk = to_blocked(s)
        assert blk.numel() == -(-R // 128) * 128 * -(-C // 4) * 4 and blk.dtype == s.dtype
        assert torch.equal(from_blocked(blk, R, C).view(torch.uint8), s.view(torch.uint8))


# ---- GEMV --------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,L", [(37, 160, 3), (64, 512, 1), (5, 32, 2), (1, 16, 1)])
def test_gemv_full_range_matches_reference(device, M, K, L):
    x = make_inputs(M, K, L, device, n_pad=3)  # random bytes: all 16 codes, both signs, in both nibbles
    c = _gemv(x, out=x["c"])
    assert c is x["c"]
    assert rel_err(c, _ref(x)) <= GEMV_TOL


def test_gemv_scales_across_e4m3_range(device):
    # sign-carrying scales over the whole finite e4m3 range (subnormals included); alpha keeps fp16 finite
    M, K, L = 33, 256, 2
    x = make_inputs(M, K, L, device, n_pad=1)
    x["sfa"] = random_scales((L, M, K // 16), device, 0x00, 0x7E, signed=True).permute(1, 2, 0)
    x["sfb"] = random_scales((L, 1, K // 16), device, 0x00, 0x7E, signed=True).permute(1, 2, 0)
    alpha = 2.0 ** -16
    assert rel_err(_gemv(x, alpha=alpha), _ref(x, alpha)) <= GEMV_TOL


def test_gemv_exact_single_block_every_scale(device):
    # K = 16: each output is one block sum times sfa * sfb, exact in fp32, so it must equal the fp64
    # reference rounded to fp16 bit for bit; one row per finite e4m3 byte (all magnitudes, both signs)
    codes = torch.arange(256)
    codes = codes[(codes & 0x7F) != 0x7F]  # 254 finite scales
    M = codes.numel()
    a_codes = torch.tensor([1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 0, 8])  # every code once
    b_codes = torch.tensor([7, 7, 6, 5, 4, 3, 2, 1, 15, 14, 13, 12, 11, 10, 9, 7])
    a = _codes_to_bytes(a_codes)[None, :, None].expand(M, 8, 1).contiguous().to(device)
    b = _codes_to_bytes(b_codes)[None, :, None].to(device)
    sfa = codes.to(torch.uint8).view(torch.float8_e4m3fn)[:, None, None].to(device)
    sfb = torch.tensor([[[1.0]]]).to(torch.float8_e4m3fn).to(device)
    c = nvfp4_gemv(a, b, sfa, sfb)
    ref = nvfp4_gemv_ref(a, b, sfa, sfb)
    assert torch.equal(c, ref.half())
    # hand check of one row: sum(a * b) with the codes above, times sfa = 1 (byte 0x38)
    av, bv = torch.tensor(E2M1_VALUES)[a_codes], torch.tensor(E2M1_VALUES)[b_codes]
    row = int((codes == 0x38).nonzero())
    assert float(c[row, 0, 0]) == float((av * bv).sum())


def test_gemv_nibble_order(device):
    # a = [0.5, 1.0, 0...] (byte 0x21), b = [1, 0, ...]: the result is 0.5, not 1.0
    a = torch.zeros(1, 8, 1, dtype=torch.uint8)
    a[0, 0, 0] = 0x21
    b = torch.zeros(1, 8, 1, dtype=torch.uint8)
    b[0, 0, 0] = 0x02
    one = torch.ones(1, 1, 1).to(torch.float8_e4m3fn)
    c = nvfp4_gemv(a.to(device), b.to(device), one.to(device), one.to(device))
    assert c.item() == 0.5


def test_gemv_views_out_and_uint8(device):
    M, K, L = 20, 96, 2
    big = make_inputs(M + 6, K + 32, L, device, n_pad=4)
    # a view offset by 16 values (8 bytes, aligned fast path) and by 2 values (1 byte: copied once)
    for k0 in (16, 2):
        x = {"a": big["a"].view(torch.uint8)[3:3 + M, k0 // 2:k0 // 2 + K // 2],
             "b": big["b"][:, k0 // 2:k0 // 2 + K // 2], "sfa": big["sfa"][3:3 + M, 1:1 + K // 16],
             "sfb": big["sfb"][1:, 1:1 + K // 16]}
        out = torch.full((M, 3, L), float("nan"), dtype=torch.float16, device=device)[:, 1:2]  # strided out
        c = _gemv(x, out=out)
        assert c.data_ptr() == out.data_ptr()
        assert rel_err(c, _ref(x)) <= GEMV_TOL


@pytest.mark.parametrize("cfg", [dict(BM=8, BB=16, num_warps=4, split=3), dict(BM=4, BB=32, num_warps=2, split=2),
                                 dict(BM=16, BB=64, num_warps=4, split=1), dict(BM=2, BB=16, num_warps=1, prefetch=True,
                                                                               split=1)])
def test_gemv_launch_configs_poisoned(device, cfg):
    # fixed tile configs, including split K (fp32 partials + ordered reduction), into NaN-poisoned outputs
    M, K, L = 29, 288, 2
    x = make_inputs(M, K, L, device, n_pad=2)
    out = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device=device)
    gemv_launch(x["a"].view(torch.uint8), x["b"].view(torch.uint8), x["sfa"].view(torch.uint8),
                x["sfb"].view(torch.uint8), out, 0.5, cfg=cfg)
    assert rel_err(out, _ref(x, 0.5)) <= GEMV_TOL


@pytest.mark.parametrize("cfg", [
    dict(BM=8, BB=16, num_warps=4, split=1, pdl=True, pre=1, trigger="entry"),
    dict(BM=8, BB=16, num_warps=4, split=1, pdl=True, pre=2, trigger="last_load"),
    dict(BM=4, BB=32, num_warps=2, split=3, pdl=True, pre=2, trigger="wait"),        # split: partials after the wait
    dict(BM=4, BB=64, num_warps=2, split=1, pdl=True, pre=2, trigger="last_load"),   # PRE 2 > tiles per program
    dict(BM=2, BB=16, num_warps=1, split=1, pdl=True, pre=1, prefetch=True, trigger="last_load"),
    dict(BM=8, BB=32, num_warps=4, split=1, pdl=True, pre=0, trigger="none"),
    dict(BM=4, BB=32, num_warps=2, split=1, persistent=1),                           # 4 programs, 16 row tiles
    dict(BM=4, BB=32, num_warps=2, split=1, persistent=2, pdl=True, pre=1, trigger="entry"),
    dict(BM=4, BB=32, num_warps=2, split=2, persistent=1),                           # split: not persistent
])
def test_gemv_pdl_order_and_persistent_bit_identical(device, cfg):
    # the PDL code order (first weight tiles loaded before the wait, peeled) and the persistent grid sum the
    # tiles in the same order as the default kernel: equal bit for bit, and to the reference within GEMV_TOL
    M, K, L = 29, 480, 2  # 30 blocks: a partial last tile for every BB
    x = make_inputs(M, K, L, device, n_pad=2)
    args = [x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")]
    base = {k: cfg[k] for k in ("BM", "BB", "num_warps", "split")}
    base["prefetch"] = cfg.get("prefetch", False)
    want = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device=device)
    gemv_launch(*args, want, 0.5, cfg=base)
    out = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device=device)
    gemv_launch(*args, out, 0.5, cfg=cfg)
    assert torch.equal(out, want)
    assert rel_err(out, _ref(x, 0.5)) <= GEMV_TOL


def test_gemv_nan_scale_and_overflow(device):
    M, K, L = 6, 64, 1
    x = make_inputs(M, K, L, device, n_pad=1)
    sfa = x["sfa"].clone()
    sfa.view(torch.uint8)[2, 1, 0] = 0x7F  # e4m3fn NaN
    sfa.view(torch.uint8)[4, 3, 0] = 0xFF  # and the negative NaN (not -480)
    x["sfa"] = sfa
    c = _gemv(x)
    assert torch.isnan(c[[2, 4]]).all() and not torch.isnan(c[[0, 1, 3, 5]]).any()
    y = make_inputs(M, K, L, device, n_pad=1, scale_bytes=(0x7E, 0x7E))  # 448 * 448 * 36: beyond fp16
    ref = _ref(y)
    c = _gemv(y)
    assert torch.equal(torch.isinf(c), torch.isinf(ref.half()))


@pytest.mark.parametrize("M,K,L", [(37, 4096 + 32, 2), (20, 160, 3)])
def test_gemv_static_weights_bit_identical(device, M, K, L):
    # static_weights runs the PDL code order (first weight tile before the wait; under the interpreter without
    # the launch) and, for rows of >= 256 blocks, the 4-warp layout: the same sums in the same order
    x = make_inputs(M, K, L, device)
    c0 = nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"])
    c1 = nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], static_weights=True)
    assert torch.equal(c0.view(torch.int16), c1.view(torch.int16)) and rel_err(c1, _ref(x)) <= GEMV_TOL


def test_gemv_static_plan_short_rows(device):
    # rows of 128-256 blocks and many row tiles: static_weights takes one-warp programs of two 64-block tiles
    # (first loaded before the wait), unmasked. Equal bit for bit to the same layout launched without PDL and with
    # masked loads, and to the reference within GEMV_TOL
    M, K, L = 256, 2048, 1
    sms = 4 if device.type == "cpu" else torch.cuda.get_device_properties(device).multi_processor_count
    M = max(M, 64 * sms)  # >= 16 row tiles of 4 rows per SM
    plan = gemv_plan(M, K // 16, L, device, static_weights=True)
    assert (plan["BB"], plan["num_warps"], plan["pdl"], plan["pre"], plan["even"]) == (64, 1, True, 1, True)
    x = make_inputs(M, K, L, device, n_pad=1)
    args = [x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")]
    out = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device=device)
    gemv_launch(*args, out, 1.0, cfg=plan)
    want = torch.full_like(out, float("nan"))
    gemv_launch(*args, want, 1.0, cfg={k: v for k, v in plan.items() if k not in ("pdl", "pre", "trigger", "even")})
    assert torch.equal(out, want) and rel_err(out, _ref(x)) <= GEMV_TOL
    assert rel_err(nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], static_weights=True), _ref(x)) <= GEMV_TOL


def test_custom_kernel_entry(device):
    M, K, L = 16, 64, 2
    x = make_inputs(M, K, L, device, n_pad=128, full_range=False)
    data = (x["a"], x["b"], x["sfa"], x["sfb"], None, None, x["c"])
    c = custom_kernel(data)
    assert c is x["c"] and rel_err(c, _ref(x)) <= GEMV_TOL
    with pytest.raises(TypeError, match="data must be a tuple"):
        custom_kernel(None)
    with pytest.raises(ValueError, match="data must hold 7 items"):
        custom_kernel(data[:6])


@pytest.mark.parametrize("gs", [float("nan"), float("inf"), -1.0, 0.0], ids=["nan", "inf", "negative", "zero"])
def test_global_scale_rules(device, gs):
    """One rule for every nvfp4 function that can read the global scale on the host: finite and positive."""
    w = torch.randn(4, 32, device=device)
    p, s, _ = nvfp4_quantize(w)
    x = torch.randn(2, 32, device=device).half()
    for call in (lambda g: nvfp4_quantize(w, g), lambda g: nvfp4_dequantize(p, s, g)):
        for g in (gs, torch.tensor(gs, device=device)):
            with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
                call(g)
    with pytest.raises(ValueError, match="global_scale must be"):
        nvfp4_linear(x, p, s, gs)


def test_k_zero_refused_everywhere(device):
    with pytest.raises(ValueError, match="positive multiple of 16"):
        nvfp4_quantize(torch.randn(4, 0, device=device))
    with pytest.raises(ValueError, match="positive multiple of 16"):
        nvfp4_dequantize(torch.zeros(4, 0, dtype=torch.uint8, device=device),
                         torch.zeros(4, 0, device=device).to(torch.float8_e4m3fn))


def test_gemv_bad_inputs(device):
    x = make_inputs(8, 32, 1, device, n_pad=1)
    a, b, sfa, sfb = x["a"], x["b"], x["sfa"], x["sfb"]
    with pytest.raises(TypeError, match="a must have dtype"):
        nvfp4_gemv(a.view(torch.uint8).to(torch.int8), b, sfa, sfb)
    with pytest.raises(TypeError, match="sfa must have dtype"):
        nvfp4_gemv(a, b, sfa.view(torch.uint8), sfb)
    with pytest.raises(ValueError, match="a must have 3 dims"):
        nvfp4_gemv(a[:, :, 0], b, sfa, sfb)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_gemv(a[:, :4], b[:, :4], sfa[:, :1], sfb[:, :1])  # K = 8
    with pytest.raises(ValueError, match="sfa must have shape"):
        nvfp4_gemv(a, b, sfa[:, :1], sfb)  # K/16 mismatch
    with pytest.raises(ValueError, match="sfb must be"):
        nvfp4_gemv(a, b, sfa, sfb[:, :1])
    with pytest.raises(ValueError, match="b must be"):
        nvfp4_gemv(a, b[:, :8], sfa, sfb)
    with pytest.raises(ValueError, match="out must have shape"):
        nvfp4_gemv(a, b, sfa, sfb, out=torch.empty(8, 2, 1, dtype=torch.float16, device=device))
    with pytest.raises(TypeError, match="out must have dtype"):
        nvfp4_gemv(a, b, sfa, sfb, out=torch.empty(8, 1, 1, device=device))
    with pytest.raises(ValueError, match="one device"):
        nvfp4_gemv(a, b, sfa, sfb.to("meta"))
    with pytest.raises(ValueError, match="alpha must be finite"):
        nvfp4_gemv(a, b, sfa, sfb, alpha=float("nan"))
    with pytest.raises(TypeError, match="static_weights must be a bool"):
        nvfp4_gemv(a, b, sfa, sfb, static_weights=1)
    # an out whose elements share memory would be written several times over
    with pytest.raises(ValueError, match="out must not overlap"):
        nvfp4_gemv(a, b, sfa, sfb, out=torch.empty(1, 1, 1, dtype=torch.float16, device=device).expand(8, 1, 1))


# ---- linear ------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,N,K,bias", [(1, 96, 160, True), (3, 200, 256, False), (16, 64, 512, True),
                                        (17, 40, 64, True)])
def test_linear_matches_reference(device, T, N, K, bias):
    x = make_linear_inputs(T, N, K, torch.float16, device, bias=bias)
    y = nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
    ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
    assert y.dtype == torch.float16 and y.shape == (T, N)
    assert rel_err(y, ref) <= LINEAR_TOL[torch.float16]


def test_linear_leading_dims_float_scale_fp4_dtype(device):
    x = make_linear_inputs(6, 48, 96, torch.float16, device)
    x3 = x["x"].reshape(2, 3, 96)
    y = nvfp4_linear(x3, x["packed"].view(torch.float4_e2m1fn_x2), x["scales"], float(x["gs"]))
    ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"])
    assert y.shape == (2, 3, 48) and rel_err(y.reshape(6, 48), ref) <= LINEAR_TOL[torch.float16]


def test_linear_split_k_poisoned(device):
    T, N, K = 5, 40, 512
    x = make_linear_inputs(T, N, K, torch.float16, device)
    for split in (1, 3):
        y = torch.full((T, N), float("nan"), dtype=torch.float16, device=device)
        linear_launch(x["x"], x["packed"], x["scales"].view(torch.uint8), x["gs"].reshape(1), x["bias"], y,
                      cfg=dict(BN=16, BKH=32, num_warps=4, split=split))
        ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
        assert rel_err(y, ref) <= LINEAR_TOL[torch.float16]


def test_dequant_kernel_poisoned(device):
    x = make_linear_inputs(1, 37, 96, torch.float16, device)
    buf = torch.full((37, 112), float("nan"), dtype=torch.float16, device=device)
    w = buf[:, :96]  # a row-strided view: a store past a row's end would land in the 16 poisoned columns after it
    dequant_launch(x["packed"], x["scales"].view(torch.uint8), x["gs"].reshape(1), w)
    assert torch.equal(w, nvfp4_dequantize(x["packed"], x["scales"], x["gs"], dtype=torch.float16))
    assert torch.isnan(buf[:, 96:]).all()
    # NaN scales (0x7f and 0xff) decode to NaN in the dequantize kernel too
    s8 = x["scales"].view(torch.uint8).clone()
    s8[3, 2], s8[5, 0] = 0x7F, 0xFF
    dequant_launch(x["packed"], s8, x["gs"].reshape(1), w)
    assert torch.isnan(w[3, 32:48]).all() and torch.isnan(w[5, :16]).all() and not torch.isnan(w[[0, 1, 2, 4]]).any()


def test_nvfp4_linear_module(device):
    lin = torch.nn.Linear(128, 72).to(device)
    q = NVFP4Linear.from_linear(lin)
    x = torch.randn(2, 5, 128, device=device).half()
    y = q(x)
    ref = nvfp4_linear_ref(x.reshape(10, 128), q.packed, q.scales, q.global_scale, q.bias).reshape(2, 5, 72)
    assert rel_err(y, ref) <= LINEAR_TOL[torch.float16]
    # and it approximates the float layer to NVFP4 accuracy (weights ~10 % relative RMS error)
    assert rel_err(y, lin(x.float())) < 0.15
    assert "in_features=128" in repr(q)


def test_linear_bad_inputs(device):
    x = make_linear_inputs(2, 32, 64, torch.float16, device)
    xx, p, s, gs = x["x"], x["packed"], x["scales"], x["gs"]
    with pytest.raises(TypeError, match="x must have dtype"):
        nvfp4_linear(xx.float(), p, s, gs)
    with pytest.raises(ValueError, match="x's last dim"):
        nvfp4_linear(xx[:, :32], p, s, gs)
    with pytest.raises(ValueError, match="scales must have shape"):
        nvfp4_linear(xx, p, s[:, :2], gs)
    with pytest.raises(TypeError, match="global_scale must have dtype"):
        nvfp4_linear(xx, p, s, gs.double())
    with pytest.raises(ValueError, match="global_scale must hold one value"):
        nvfp4_linear(xx, p, s, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="bias must have shape"):
        nvfp4_linear(xx, p, s, gs, torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize(torch.randn(4, 24))
    with pytest.raises(ValueError, match="finite"):
        nvfp4_quantize(torch.tensor([[float("nan")] * 16]))
    with pytest.raises(ValueError, match="blocked must hold"):
        from_blocked(torch.zeros(10, dtype=torch.uint8), 3, 3)
    with pytest.raises(TypeError, match="linear must be"):
        NVFP4Linear.from_linear(torch.nn.Conv1d(1, 1, 1))
    with pytest.raises(ValueError, match="positive multiple of 16"):  # K = 0
        nvfp4_linear(xx[:, :0], p[:, :0], s[:, :0], gs)
    w = torch.randn(4, 32, device=device)
    with pytest.raises(ValueError, match="global_scale must be a number or a one-element"):
        nvfp4_quantize(w, torch.ones(2, device=device))
    with pytest.raises(TypeError, match="global_scale must be a number"):
        nvfp4_quantize(w, "0.1")
    pw, sw, gw = nvfp4_quantize(w)
    with pytest.raises(ValueError, match="global_scale must be a number or a one-element"):
        nvfp4_dequantize(pw, sw, torch.ones(16, device=device))  # would broadcast per position
    with pytest.raises(TypeError, match="dtype must be a floating"):
        nvfp4_dequantize(pw, sw, gw, dtype="float32")
    with pytest.raises(ValueError, match="rows must be >= 0"):
        from_blocked(torch.zeros(0, dtype=torch.uint8), -1, -1)
    with pytest.raises(ValueError, match="in_features must be >= 16"):
        NVFP4Linear(-16, 4)
    with pytest.raises(TypeError, match="bias must be a bool"):
        NVFP4Linear(32, 4, bias="no")


def test_torch_compile_fullgraph(device):
    x = make_inputs(12, 64, 2, device, n_pad=1)
    lx = make_linear_inputs(3, 24, 64, torch.float16, device)

    def f(a, b, sfa, sfb, xx, p, s, gs):
        return nvfp4_gemv(a, b, sfa, sfb) * 2, nvfp4_linear(xx, p, s, gs) + 1

    args = (x["a"], x["b"], x["sfa"], x["sfb"], lx["x"], lx["packed"], lx["scales"], lx["gs"])
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    c, y = torch.compile(f, fullgraph=True, backend=backend)(*args)
    assert rel_err(c, 2 * _ref(x)) <= GEMV_TOL
    assert rel_err(y, nvfp4_linear_ref(lx["x"], lx["packed"], lx["scales"], lx["gs"]) + 1) <= 2e-3


# ---- GPU -----------------------------------------------------------------------------------------

CONTEST_TESTS = [(128, 256, 1), (128, 1536, 1), (128, 3072, 1), (256, 7168, 1), (2432, 4608, 2), (384, 7168, 2),
                 (512, 512, 2), (512, 4096, 2), (512, 1536, 2)]
BENCH_SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4), (4096, 4096, 1), (14336, 4096, 1),
                (4096, 14336, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,L", CONTEST_TESTS + BENCH_SHAPES)
def test_gpu_contest_shapes(M, K, L):
    dev = torch.device("cuda")
    x = make_inputs(M, K, L, dev, full_range=False, scale_bytes=(0x00, 0x40))  # the contest's codes, scales 0..2
    c = custom_kernel((x["a"], x["b"], x["sfa"], x["sfb"], None, None, x["c"]))
    ref = _ref(x)
    assert rel_err(c, ref) <= GEMV_TOL
    assert torch.allclose(c.float(), ref.half().float(), rtol=1e-3, atol=1e-3)  # the contest's own criterion
    y = make_inputs(M, K, L, dev)  # all codes: the asm path must equal the integer fallback bit for bit
    c = _gemv(y)
    assert rel_err(c, _ref(y)) <= GEMV_TOL
    out = torch.full_like(c, float("nan"))
    gemv_launch(y["a"].view(torch.uint8), y["b"].view(torch.uint8), y["sfa"].view(torch.uint8),
                y["sfb"].view(torch.uint8), out, 1.0, use_asm=False)
    assert torch.equal(out, c)


@pytest.mark.gpu
@pytest.mark.parametrize("BB,R,nw,split,pf", [(256, 8, 4, 1, 0), (128, 4, 4, 2, 0), (64, 8, 4, 3, 0),
                                              (32, 2, 2, 1, 0), (256, 2, 8, 4, 0), (16, 4, 4, 1, 0), (256, 2, 4, 1, 1),
                                              (128, 4, 2, 2, 1), (1024, 1, 4, 1, 0)])
def test_gpu_configs_poisoned(BB, R, nw, split, pf):
    M, K, L = 1000, 2048 + 16, 3  # odd M and a K tail
    x = make_inputs(M, K, L, torch.device("cuda"))
    out = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device="cuda")
    cfg = dict(BM=gemv_tile(BB, R, nw), BB=BB, num_warps=nw, split=split, prefetch=bool(pf))
    gemv_launch(x["a"].view(torch.uint8), x["b"].view(torch.uint8), x["sfa"].view(torch.uint8),
                x["sfb"].view(torch.uint8), out, 1.0, cfg=cfg)
    assert rel_err(out, _ref(x)) <= GEMV_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4, 16, 64])
def test_gpu_linear(dtype, T):
    x = make_linear_inputs(T, 1000, 4096, dtype, torch.device("cuda"))
    y = nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
    assert rel_err(y, nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])) <= LINEAR_TOL[dtype]


@pytest.mark.gpu
def test_gpu_cuda_graph():
    dev = torch.device("cuda")
    x = make_inputs(4096, 7168, 2, dev)
    lx = make_linear_inputs(4, 512, 1024, torch.bfloat16, dev)
    _gemv(x, out=x["c"])
    y = nvfp4_linear(lx["x"], lx["packed"], lx["scales"], lx["gs"])  # compile before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _gemv(x, out=x["c"])
        y = nvfp4_linear(lx["x"], lx["packed"], lx["scales"], lx["gs"])
    fresh = make_inputs(4096, 7168, 2, dev)
    for k in ("a", "b", "sfa", "sfb"):
        x[k].copy_(fresh[k])
    lx["x"].copy_(torch.randn_like(lx["x"]))
    x["c"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(x["c"], _ref(x)) <= GEMV_TOL
    assert rel_err(y, nvfp4_linear_ref(lx["x"], lx["packed"], lx["scales"], lx["gs"])) <= LINEAR_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_static_weights_graph():
    # back-to-back calls in a graph, each reading an activation the previous kernel (a copy) just wrote: the
    # early-launched GEMV must wait for it before reading b; weights were written long before
    dev = torch.device("cuda")
    x = make_inputs(7168, 2048, 4, dev)
    b_next = [torch.empty_like(x["b"]) for _ in range(3)]
    outs = [torch.empty_like(x["c"]) for _ in range(3)]
    nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=outs[0], static_weights=True)  # compile
    srcs = [make_inputs(7168, 2048, 4, dev)["b"] for _ in range(3)]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(3):
            b_next[i].copy_(srcs[i])
            nvfp4_gemv(x["a"], b_next[i], x["sfa"], x["sfb"], out=outs[i], static_weights=True)
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    for i in range(3):
        want = nvfp4_gemv(x["a"], srcs[i], x["sfa"], x["sfb"])
        assert torch.equal(outs[i].view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [dict(pdl=True, pre=1, trigger="entry"), dict(pdl=True, pre=2, trigger="last_load"),
                                   dict(pdl=True, pre=0, trigger="none"), dict(persistent=16),
                                   dict(persistent=16, pdl=True, pre=1, trigger="entry"),
                                   dict(pdl=True, pre=1, trigger="wait", split=3),
                                   dict(pdl=True, pre=1, trigger="entry", l2=True),  # the static-weights plan
                                   dict(pdl=True, pre=0, trigger="entry", l2=True)])
def test_gpu_pdl_variants_graph(extra):
    # back-to-back PDL launches captured in a graph, each call on its own inputs, one of them split K:
    # every output equals the default kernel's bit for bit
    dev = torch.device("cuda")
    M, K, L = 1000, 2048 + 16, 3
    xs = [make_inputs(M, K, L, dev) for _ in range(3)]
    plan = gemv_plan(M, K // 16, L, dev)
    cfg = {**plan, **extra}

    def call(x, out, c):
        gemv_launch(*(x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")), out, 1.0, cfg=c)

    want = [torch.full_like(x["c"], float("nan")) for x in xs]
    for x, w in zip(xs, want):
        call(x, w, plan)
    outs = [torch.full_like(x["c"], float("nan")) for x in xs]
    for x, o in zip(xs, outs):
        call(x, o, cfg)  # compile before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(2):
            for x, o in zip(xs, outs):
                call(x, o, cfg)
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    for x, o, w in zip(xs, outs, want):
        assert torch.equal(o, w) and rel_err(o, _ref(x)) <= GEMV_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,N,K,cfg", [(1, 37, 96, {}), (8, 77, 1040, {}), (5, 1000, 14336, {}),
                                       (3, 300, 1024, {"W": 8, "U": 2}), (9, 129, 4096, {}), (16, 200, 2064, {}),
                                       (13, 4096, 512, {"programs_per_sm": 1}),
                                       (4, 2050, 8192, {"programs_per_sm": 1}),
                                       (11, 2048, 8192, {"programs_per_sm": 1})])
def test_gpu_linear_mma(dtype, T, N, K, cfg):
    # the register-fed mma kernel (T <= 16: one or two token groups): full-range weight bytes (all codes, both
    # signs) and scales over the e4m3 range, NaN-poisoned output, odd N and K/16, split K and not, bias; a wrong
    # fragment layout would mix rows, tokens or K slices and miss the reference by far more than the tolerance
    dev = torch.device("cuda")
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
    s = random_scales((N, K // 16), dev, 0x08, 0x60)
    x = torch.randn(T, K, device=dev).to(dtype)
    gs = torch.full((1,), 0.37, device=dev)
    bias = torch.randn(N, device=dev)
    ref = nvfp4_linear_ref(x, w, s, gs, bias)
    y = torch.full((T, N), float("nan"), dtype=dtype, device=dev)
    linear_launch(x, w, s.view(torch.uint8), gs, bias, y, cfg={"kernel": "mma", **cfg})
    assert rel_err(y, ref) <= LINEAR_TOL[dtype]
    dot = torch.full((T, N), float("nan"), dtype=dtype, device=dev)
    linear_launch(x, w, s.view(torch.uint8), gs, bias, dot, cfg={"kernel": "dot"})
    assert rel_err(y, dot) <= LINEAR_TOL[dtype]


@pytest.mark.gpu
def test_gpu_linear_mma_unaligned_falls_back():
    # activations whose rows are not 8-byte aligned cannot take the mma kernel: the dot kernel serves them
    dev = torch.device("cuda")
    x = make_linear_inputs(3, 64, 256, torch.bfloat16, dev)
    xs = torch.empty(3, 256 + 1, dtype=torch.bfloat16, device=dev)[:, 1:]
    xs.copy_(x["x"])
    y = nvfp4_linear(xs, x["packed"], x["scales"], x["gs"], x["bias"])
    ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
    assert rel_err(y, ref) <= LINEAR_TOL[torch.bfloat16]
