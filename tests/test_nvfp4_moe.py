"""nvfp4_moe (ops/nvfp4_gemv/moe.py): a MoE layer's routed NVFP4 experts (tiled layout, stacked) against the fp32
reference; dropped slots, NaN, errors, torch.compile / opcheck; CUDA-graph replay on the GPU."""
import pytest
import torch

from llmkernels import nvfp4_quantize
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4.moe import nvfp4_moe
from llmkernels.ops.nvfp4.moe_reference import nvfp4_moe_ref
from llmkernels.ops.nvfp4.tiled_layout import tile_packed, tile_scales

CUDA = torch.cuda.is_available()
# x, gate / up outputs and h round to the dtype like a layer's (the reference rounds the same three), the down
# products sum in fp32: a few roundings of the dtype's step (fp16 2^-11, bf16 2^-8)
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _proj(E, N, K, device, g):
    ps, ss, gs = [], [], []
    for _ in range(E):
        p, s, gl = nvfp4_quantize(torch.randn(N, K, generator=g).to(device) * 0.1)
        ps.append(p)
        ss.append(s)
        gs.append(gl.reshape(()).float())
    plain = (torch.stack(ps), torch.stack(ss), torch.stack(gs))
    return plain, (torch.stack([tile_packed(p) for p in ps]), torch.stack([tile_scales(s) for s in ss]), plain[2])


def _inputs(device, E=3, H=256, inter=256, T=2, k=2, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    projs = [_proj(E, inter, H, device, g), _proj(E, inter, H, device, g), _proj(E, H, inter, device, g)]
    x = torch.randn(T, H, generator=g).to(device, dtype)
    idx = torch.randint(0, E, (T, k), generator=g).to(device)
    w = torch.rand(T, k, generator=g).to(device, dtype)
    return x, idx, w, [p[0] for p in projs], [p[1] for p in projs]


def test_matches_reference_with_a_dropped_slot(device):
    x, idx, w, plain, tiled = _inputs(device)
    idx[1, 0] = 3  # = E: dropped (transformers' convention), adds nothing
    y = nvfp4_moe(x, idx, w, *tiled)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel_err(y, nvfp4_moe_ref(x, idx, w, *plain)) <= TOL[torch.float16]


@pytest.mark.parametrize("T, E, H, inter, k, routing", [(20, 4, 256, 256, 2, "random"), (33, 6, 512, 256, 3, "dropped"),
                                                       (17, 3, 256, 512, 2, "one")])
def test_grouped_prefill_matches_reference(device, T, E, H, inter, k, routing):
    """The pairs grouped by expert (the default past MOE_MAX_T, forced here: moe_grouped's tl.dot tiles, on sm_90 the
    mma tiles), dropped slots, an expert taking every token, NaN-poisoned intermediates (rows of dropped slots are
    never read); the public call too."""
    from llmkernels.ops.nvfp4.moe import _flat, _moe
    from llmkernels.ops.nvfp4.spec import MOE_TOL, make_moe_inputs
    x = make_moe_inputs(T, E, H, inter, k, torch.float16, device, plain=True)
    if routing == "dropped":
        x["idx"][0, 0], x["idx"][3, -1], x["idx"][7, 1] = E, -1, E + 9
    elif routing == "one":
        x["idx"].fill_(1)
    ref = nvfp4_moe_ref(x["x"], x["idx"], x["w"], *x["plain"])
    y = _moe(x["x"], x["idx"], x["w"], *_flat(x["gate"], x["up"], x["down"]), grouped=True)
    assert rel_err(y, ref) <= MOE_TOL[torch.float16]
    assert rel_err(nvfp4_moe(x["x"], x["idx"], x["w"], x["gate"], x["up"], x["down"]), ref) <= MOE_TOL[torch.float16]


@pytest.mark.parametrize("T", [2, 20])  # the decode kernels; grouped by expert
def test_nan_in_a_token_stays_in_its_row(device, T):
    x, idx, w, plain, tiled = _inputs(device, T=T)
    x[0, 5] = float("nan")
    y = nvfp4_moe(x, idx, w, *tiled)
    assert torch.isnan(y[0]).all() and not torch.isnan(y[1:]).any()


def test_errors(device):
    x, idx, w, plain, tiled = _inputs(device, inter=512)
    with pytest.raises(TypeError, match="x must have dtype"):
        nvfp4_moe(x.float(), idx, w, *tiled)
    with pytest.raises(ValueError, match="top_k_index and top_k_weights"):
        nvfp4_moe(x, idx[:, :1], w, *tiled)
    with pytest.raises(TypeError, match="top_k_index must have dtype"):
        nvfp4_moe(x, idx.float(), w, *tiled)
    with pytest.raises(ValueError, match="down"):
        nvfp4_moe(x, idx, w, tiled[0], tiled[1], tiled[0])  # [E, I, H/2] where [E, H, I/2] is due
    gate = (tiled[0][0][:, :, :64].contiguous(), tiled[0][1][:, :, :8].contiguous(), tiled[0][2])
    with pytest.raises(ValueError, match="gate"):
        nvfp4_moe(x[:, :128], idx, w, gate, gate, tiled[2])


def test_compile_and_opcheck(device):
    x, idx, w, plain, tiled = _inputs(device, T=1, k=2)
    f = torch.compile(lambda *a: nvfp4_moe(*a), fullgraph=True, backend="aot_eager")
    assert rel_err(f(x, idx, w, *tiled), nvfp4_moe_ref(x, idx, w, *plain)) <= TOL[torch.float16]
    u8 = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for p in tiled for t in p]
    torch.library.opcheck(torch.ops.llmkernels.nvfp4_moe.default, (x, idx, w, *u8),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 4, 16])
def test_gpu_bf16_and_graph_replay(T):
    x, idx, w, plain, tiled = _inputs("cuda", E=8, H=512, inter=256, T=T, k=4, dtype=torch.bfloat16)
    y = nvfp4_moe(x, idx, w, *tiled)
    assert rel_err(y, nvfp4_moe_ref(x, idx, w, *plain)) <= TOL[torch.bfloat16]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = nvfp4_moe(x, idx, w, *tiled)
    idx.copy_(torch.randint(0, 8, idx.shape, device="cuda"))  # routing read on the device at replay
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, nvfp4_moe_ref(x, idx, w, *plain)) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, E, H, inter, k, routing", [
    (1, 16, 2048, 768, 8, "random"),  # a Qwen3-30B-A3B layer's shapes, fewer experts
    (100, 16, 2048, 768, 8, "dropped"),  # past MOE_MAX_T: the mma tiles by default; each path forced
    (5, 6, 768, 512, 3, "dropped"),   # k not a power of 2 (the down kernel's slot warps padded); dropped slots
    (16, 8, 512, 256, 6, "one"),      # all tokens to one expert (twice: repeated indices), the others unused
    (3, 4, 4096, 256, 2, "random"),   # K of 16 iterations (down: 1, I = 256)
    (9, 4, 256, 256, 3, "random"),    # gate / up and down K of one iteration
])
def test_gpu_mma_kernels_match_plain_and_reference(dtype, T, E, H, inter, k, routing):
    """The mma kernels (moe_tiled) against the fp32 reference and the plain kernels (the interpreter's path), and the
    grouped kernels (plain Triton, and the mma kernels on tiles of 8 and 16 pairs of an expert); each path forced at
    every T (the per-pair ones past MOE_MAX_T too, the grouped ones below), the mma pairs sorted by expert too."""
    from llmkernels.ops.nvfp4.moe import _flat, _moe
    from llmkernels.ops.nvfp4.spec import MOE_TOL, make_moe_inputs
    x = make_moe_inputs(T, E, H, inter, k, dtype, torch.device("cuda"), plain=True)
    idx = x["idx"]
    if routing == "dropped":
        idx[0, 1], idx[3, 2], idx[4, 0] = E, E, -1  # transformers' E; anything outside [0, E)
    elif routing == "one":
        idx.fill_(E - 1)
    ref = nvfp4_moe_ref(x["x"], idx, x["w"], *x["plain"])
    flat = _flat(x["gate"], x["up"], x["down"])
    mma = _moe(x["x"], idx, x["w"], *flat, mma=True, grouped=False)
    plain = _moe(x["x"], idx, x["w"], *flat, mma=False, grouped=False)
    grouped = _moe(x["x"], idx, x["w"], *flat, grouped=True, tiles=False)
    tiles = _moe(x["x"], idx, x["w"], *flat, grouped=True, mma=True, tiles=8)
    tiles16 = _moe(x["x"], idx, x["w"], *flat, grouped=True, mma=True, tiles=16)
    assert rel_err(mma, ref) <= MOE_TOL[dtype] and rel_err(plain, ref) <= MOE_TOL[dtype]
    assert rel_err(grouped, ref) <= MOE_TOL[dtype] and rel_err(tiles, ref) <= MOE_TOL[dtype]
    assert rel_err(tiles16, ref) <= MOE_TOL[dtype]
    # the grouping's order within an expert varies between calls (atomic cursors); a pair's sums do not
    assert torch.equal(_moe(x["x"], idx, x["w"], *flat, grouped=True, mma=True, tiles=8), tiles)
    assert torch.equal(_moe(x["x"], idx, x["w"], *flat, grouped=True, tiles=False), grouped)
    xs = torch.full((T, H + 8), float("nan"), dtype=dtype, device="cuda")[:, :H]  # a strided view, NaN outside
    xs.copy_(x["x"])
    assert rel_err(_moe(xs, idx, x["w"], *flat, mma=True, grouped=False), ref) <= MOE_TOL[dtype]
    for bt in (8, 16):
        assert rel_err(_moe(xs, idx, x["w"], *flat, grouped=True, mma=True, tiles=bt), ref) <= MOE_TOL[dtype]
    assert rel_err(nvfp4_moe(xs, idx, x["w"], x["gate"], x["up"], x["down"]), ref) <= MOE_TOL[dtype]


@pytest.mark.parametrize("mma_runs", [True, False])
def test_path_rule(monkeypatch, mma_runs):
    """Which kernels a call of T tokens takes: one program group a pair up to MOE_MAX_T (the mma pair where it runs,
    else the plain one), the pairs grouped by expert past it (the mma tiles where they run, else moe_grouped)."""
    from llmkernels.ops.nvfp4 import moe
    took = []
    monkeypatch.setattr(moe, "moe_tiled_usable", lambda x, k: mma_runs)
    monkeypatch.setattr(moe, "moe_tiled", lambda *a: took.append("mma") or a[12])
    monkeypatch.setattr(moe, "moe_tiled_pairs", lambda x, *a: took.append("tiles") or x)
    monkeypatch.setattr(moe, "moe_grouped", lambda x, *a: took.append("grouped") or x)
    monkeypatch.setattr(moe, "launch", lambda *a, **k: took.append("plain"))
    E, H, inter, k = 4, 256, 256, 2
    w = torch.zeros(E, inter, H // 2, dtype=torch.uint8)
    s = torch.zeros(E, inter, H // 16, dtype=torch.uint8)
    wd = torch.zeros(E, H, inter // 2, dtype=torch.uint8)
    sd = torch.zeros(E, H, inter // 16, dtype=torch.uint8)
    g = torch.ones(E)
    for T in (1, moe.MOE_MAX_T, moe.MOE_MAX_T + 1, 300):
        x = torch.zeros(T, H, dtype=torch.float16)
        idx = torch.zeros(T, k, dtype=torch.int32)
        moe._moe(x, idx, torch.ones(T, k), w, s, g, w, s, g, wd, sd, g)
    if mma_runs:
        assert took == ["mma", "mma", "tiles", "tiles"]
    else:  # (the plain pair is two launches)
        assert took == ["plain"] * 4 + ["grouped"] * 2


@pytest.mark.parametrize("T, k, E, BT", [(4, 2, 4, 2), (37, 3, 6, 8), (700, 8, 128, 16), (1, 1, 1, 8)])
def test_expert_tiles(device, T, k, E, BT):
    """The device-side grouping both grouped paths share (one launch): each expert's pairs
    together (in any order within it), dropped slots last with no tile, tiles of up to BT pairs of one expert, the
    grid's bound E + P / BT; P of more than one block of the kernel's loop."""
    from llmkernels.ops.nvfp4.moe_grouped import expert_tiles
    g = torch.Generator().manual_seed(T)
    idx = torch.randint(-1, E + 2, (T, k), generator=g)  # -1, E and E + 1: dropped
    if T == 4:
        idx = torch.tensor([[2, 0], [2, 5], [-1, 2], [0, 2]])
    order, pstart, tstart, tiles, log_e = expert_tiles(idx.to(device), E, BT)
    ids = idx.reshape(-1)
    key = torch.where((ids >= 0) & (ids < E), ids, E)
    counts = torch.bincount(key, minlength=E + 1)
    assert pstart.tolist() == [0] + counts.cumsum(0).tolist()
    assert tstart.tolist() == [0] + ((counts[:E] + BT - 1) // BT).cumsum(0).tolist()
    assert sorted(order.tolist()) == list(range(T * k))
    order, pstart = order.cpu().long(), pstart.tolist()
    assert all(bool((key[order[pstart[e]:pstart[e + 1]]] == e).all()) for e in range(E + 1))
    if T == 4:
        assert pstart == [0, 2, 2, 6, 6, 8] and tstart.tolist() == [0, 1, 1, 3, 3]
    assert tiles == E + (T * k + BT - 1) // BT and 2 ** log_e >= E + 1
