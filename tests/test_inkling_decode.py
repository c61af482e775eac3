import pytest
import torch

from llmkernels.checking import rel_err
from llmkernels.ops.inkling_decode.reference import band_bias
from llmkernels.ops.inkling_decode.spec import LSE_TOL, OUT_TOL, make_inputs, ref, run
from llmkernels.ops.xl_paged_decode.kernel import XLPlan


def _assert_close(x, o, lse, dtype, **kw):
    ro, rl = ref(x, **kw)
    assert o.dtype == x["q"].dtype and o.shape == x["q"].shape
    assert rel_err(o, ro) <= OUT_TOL[dtype], rel_err(o, ro)
    assert rel_err(lse, rl) <= LSE_TOL[dtype], rel_err(lse, rl)


# S, H, Hkv, D, lengths, rel_extent, layout, dtype, window, starts
CPU_CASES = [
    (3, 4, 2, 64, [37, 1, 0], 16, "dense", torch.float16, None, None),
    (2, 8, 1, 128, [70, 33], 4096, "dense", torch.float32, None, None),  # the band longer than every context
    (2, 4, 4, 64, [50, 21], 1, "dense", torch.float16, 8, None),  # E 1: the bias on the query's own key only
    (2, 16, 1, 64, [40, 17], 24, "dense", torch.float16, 16, [3, 0]),  # 16 query heads a kv head
    (2, 4, 2, 80, [60, 7], 32, "nhd", torch.float16, 20, None),
    (2, 4, 1, 96, [45, 30], 8, "legacy", torch.float32, None, [5, 0]),
    (1, 2, 2, 256, [33], 40, "dense", torch.float32, 1, None),  # window 1: the query's own key
    (2, 6, 2, 64, [90, 64], 512, "dense", torch.float16, 512, [0, 70]),  # starts past the window's start / length
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"D{c[3]}-E{c[5]}-{c[6]}-{str(c[7])[6:]}-w{c[8]}-s{c[9]}")
def test_matches_reference(case, device):
    S, H, Hkv, D, lens, E, layout, dtype, window, starts = case
    x = make_inputs(S, H, Hkv, D, lens, E, layout, dtype, device, window=window, starts=starts)
    o, lse = run(x, scale=1.0 / D, return_lse=True)
    _assert_close(x, o, lse, dtype, scale=1.0 / D)
    assert torch.equal(run(x, scale=1.0 / D), o)  # return_lse only adds lse


def test_reference_matches_direct_formula(device):
    """The reference against a loop over keys: logit = scale q.k + rel[len - 1 - t] inside the band and window."""
    x = make_inputs(2, 4, 2, 64, [19, 7], 5, "dense", torch.float32, device, window=9, starts=[0, 2])
    o, lse = ref(x, scale=0.125)
    for s in range(2):
        n, lo = int(x["lengths"][s]), max(int(x["starts"][s]), int(x["lengths"][s]) - 9)
        for h in range(4):
            logit = torch.stack([0.125 * x["q"][s, h].double() @ x["k"][s, h // 2, t].double()
                                 + (x["rel_bias"][s, h, n - 1 - t].double() if n - 1 - t < 5 else 0.0)
                                 for t in range(lo, n)])
            p = torch.softmax(logit, 0)
            want = (p[:, None] * x["v"][s, h // 2, lo:n].double()).sum(0)
            assert torch.allclose(o[s, h].double(), want, atol=1e-5)
            assert abs(lse[s, h].item() - torch.logsumexp(logit, 0).item()) < 1e-5


@pytest.mark.parametrize("fuse", [64, 0])
@pytest.mark.parametrize("layout", ["dense", "nhd"])
def test_many_splits_with_a_window(device, fuse, layout):
    """Small tiles force several splits over the window (its start not tile-aligned; some splits empty); the parts
    merge in the split kernel (eager) or a merge launch (fuse_merge 0, as under capture)."""
    x = make_inputs(3, 4, 2, 64, [190, 45, 3], 12, layout, torch.float16, device, window=77, starts=[0, 10, 0],
                    block_size=8)
    S, H, D = x["q"].shape
    out = torch.full((S, H, D), float("nan"), dtype=torch.float16, device=device)
    lse = torch.full((S, H), float("nan"), device=device)
    plan = XLPlan(x["q"], x["k"], x["v"], x["block_tables"], None, x["rel_bias"], 1.0 / D,
                  {"block_n": 16, "programs_per_sm": 16, "fuse_merge": fuse}, rel=True, window=77, starts=True)
    assert plan.parts.merge is not None  # split
    plan(x["q"], x["k"], x["v"], x["block_tables"], x["lengths"], None, x["rel_bias"], out, lse, x["starts"])
    _assert_close(x, out, lse, torch.float16, scale=1.0 / D)


def test_keys_outside_are_never_read(device):
    """NaN in K / V past each length, below the window and below starts, and in the bias past the band, changes
    nothing; a NaN in an attended key's bias entry makes that row NaN, and only it."""
    x = make_inputs(2, 4, 2, 64, [40, 30], 6, "dense", torch.float32, device, window=20, starts=[0, 15],
                    strided=False)
    want = ref(x, scale=1 / 64)
    k, v, rel = x["k"], x["v"], x["rel_bias"]
    for s, (n, lo) in enumerate([(40, 20), (30, 15)]):
        k[s, :, n:], v[s, :, n:], k[s, :, :lo], v[s, :, :lo] = (float("nan"),) * 4
    big = make_inputs(2, 4, 2, 64, [40, 30], 64, "dense", torch.float32, device, strided=False)["rel_bias"]
    big[:, :, :6] = rel
    big[:, :, 6:] = float("nan")
    x["rel_bias"] = big[:, :, :6]
    o, lse = run(x, scale=1 / 64, return_lse=True)
    assert torch.equal(o, o) and rel_err(o, want[0]) <= 1e-5 and rel_err(lse, want[1]) <= 1e-5
    x["rel_bias"] = big  # the band now reaches the NaN entries of every row
    assert torch.isnan(run(x, scale=1 / 64)).all()
    rel2 = make_inputs(2, 4, 2, 64, [40, 30], 6, "dense", torch.float32, device, strided=False)["rel_bias"]
    rel2[1, 3, 2] = float("nan")
    x["rel_bias"] = rel2
    o = run(x, scale=1 / 64)
    assert torch.isnan(o[1, 3]).all() and not torch.isnan(o[0]).any() and not torch.isnan(o[1, :3]).any()


def test_nothing_attended_and_clamped_lengths(device):
    x = make_inputs(3, 4, 2, 64, [0, 20, 20], 4, "dense", torch.float32, device, starts=[0, 25, 0], L=24)
    x["lengths"][2] = 1000  # clamped to L = 24
    o, lse = run(x, return_lse=True)
    assert torch.equal(o[:2], torch.zeros_like(o[:2])) and torch.isneginf(lse[:2]).all()
    _assert_close(x, o, lse, torch.float32)
    with pytest.raises(ValueError, match=r"lengths\[2\] = 1000 is outside \[0, L=24\]"):
        run(x, validate=True)


def test_band_bias_reference():
    rel = torch.arange(6.0).view(1, 2, 3)
    b = band_bias(rel, torch.tensor([4]), 6)
    assert b[0, 0].tolist() == [0, 2, 1, 0, 0, 0] and b[0, 1].tolist() == [0, 5, 4, 3, 0, 0]


def _bad_cases():
    def f(**over):
        return over
    return [
        (f(q=lambda x: x["q"].long()), TypeError, "q must have dtype"),
        (f(q=lambda x: x["q"][..., :48]), ValueError, "head dim D"),
        (f(q=lambda x: x["q"][:, :3]), ValueError, "multiple of the cache's kv heads"),
        (f(k=lambda x: x["k"].float()), TypeError, "share one dtype"),
        (f(k=lambda x: x["k"][:1]), ValueError, r"\[S, Hkv, L, D\]"),
        (f(v=lambda x: x["v"][:, :, :5]), ValueError, r"\[S, Hkv, L, D\]"),
        (f(k=lambda x: x["k"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError, "unit stride in its last"),
        (f(rel_bias=lambda x: x["rel_bias"][:, :3]), ValueError, "rel_bias must be"),
        (f(rel_bias=lambda x: x["rel_bias"][:, :, :0]), ValueError, "rel_extent >= 1"),
        (f(rel_bias=lambda x: x["rel_bias"].int()), TypeError, "rel_bias must have dtype"),
        (f(lengths=lambda x: x["lengths"].long()), TypeError, "lengths must have dtype"),
        (f(lengths=lambda x: x["lengths"][:1]), ValueError, "lengths must have shape"),
        (f(starts=lambda x: x["lengths"].long()), TypeError, "starts must have dtype"),
        (f(starts=lambda x: x["lengths"][:1]), ValueError, "starts must have shape"),
        (f(window=lambda x: 0), ValueError, "window"),
        (f(window=lambda x: 2.0), TypeError, "window"),
        (f(block_tables=lambda x: torch.zeros(2, 3, dtype=torch.int32, device=x["q"].device)), ValueError,
         "block_size must be one of"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_cases())))
def test_bad_inputs(i, device):
    over, exc, msg = _bad_cases()[i]
    x = make_inputs(2, 4, 2, 64, [20, 9], 8, "dense", torch.float16, device)
    for name, fn in over.items():
        x[name] = fn(x)
    with pytest.raises(exc, match=msg):
        run(x)


def test_bad_scale_and_flags(device):
    x = make_inputs(2, 4, 2, 64, [20, 9], 8, "dense", torch.float16, device)
    with pytest.raises(ValueError, match="scale must be finite"):
        run(x, scale=float("inf"))
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        run(x, return_lse=1)


def test_torch_compile_fullgraph_and_opcheck(device):
    x = make_inputs(2, 4, 2, 64, [21, 4], 8, "dense", torch.float16, device, window=10, starts=[1, 0])
    f = torch.compile(lambda x: run(x, scale=0.1, return_lse=True), fullgraph=True, backend="aot_eager")
    o, lse = f(x)
    _assert_close(x, o, lse, torch.float16, scale=0.1)
    torch.library.opcheck(torch.ops.llmkernels.inkling_decode.default,
                          (x["q"], x["k"], x["v"], x["rel_bias"], x["lengths"], None, x["starts"], 10, 0.1),
                          test_utils=("test_schema", "test_faketensor"))


# --------------------------------------------------------------------------------------------- GPU

def _gpu_matrix():
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for layout in ("dense", "nhd", "legacy"):
            for D, G, E, window in ((64, 1, 1024, None), (128, 8, 512, 512), (256, 2, 4096, None), (96, 16, 7, 300)):
                cases.append((dtype, layout, D, G, E, window))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gpu_matrix(), ids=str)
def test_gpu_matrix(case):
    dtype, layout, D, G, E, window = case
    x = make_inputs(3, 2 * G, 2, D, [5000, 700, 1], E, layout, dtype, "cuda", window=window, starts=[0, 3, 0],
                    block_size=32)
    o, lse = run(x, scale=1.0 / D, return_lse=True)
    _assert_close(x, o, lse, dtype, scale=1.0 / D)


@pytest.mark.gpu
def test_gpu_cuda_graph_and_inductor():
    x = make_inputs(2, 8, 1, 128, [3000, 40], 1024, "dense", torch.bfloat16, "cuda", window=None, L=4096)
    for _ in range(2):
        run(x, scale=1 / 128)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = run(x, scale=1 / 128)
    x["lengths"].copy_(torch.tensor([4000, 1], dtype=torch.int32))
    x["q"].normal_()
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(o, ref(x, scale=1 / 128)[0]) <= OUT_TOL[torch.bfloat16]
    f = torch.compile(lambda x: run(x, scale=1 / 128) * 2, fullgraph=True)
    assert rel_err(f(x), 2 * ref(x, scale=1 / 128)[0]) <= OUT_TOL[torch.bfloat16]
