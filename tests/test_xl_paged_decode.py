import pytest
import torch

from llmkernels import xl_paged_decode
from llmkernels.checking import rel_err
from llmkernels.ops.xl_paged_decode import kernel as K
from llmkernels.ops.xl_paged_decode.reference import cache_as_nhd, xl_paged_decode_ref
from llmkernels.ops.xl_paged_decode.spec import LSE_TOL, OUT_TOL, make_inputs, ref, run


def _assert_close(x, o, lse, dtype, **kw):
    ro, rl = ref(x, **kw)
    assert o.dtype == x["q"].dtype and o.shape == x["q"].shape
    assert rel_err(o, ro) <= OUT_TOL[dtype], rel_err(o, ro)
    assert rel_err(lse, rl) <= LSE_TOL[dtype], rel_err(lse, rl)


# S, H, Hkv, D, block_size, contexts, layout, dtype, u, bd
CPU_CASES = [
    (3, 4, 2, 64, 16, [37, 1, 0], "nhd", torch.float16, "head", "strided"),
    (2, 4, 4, 80, 8, [50, 17], "legacy", torch.float16, "seq", "contig"),
    (2, 6, 2, 96, 32, [65, 31], "nhd", torch.float32, None, None),
    (1, 8, 1, 128, 64, [129], "legacy", torch.float16, "head", None),
    (2, 2, 2, 256, 256, [300, 5], "legacy", torch.float32, None, "strided"),
    (2, 4, 1, 64, 8, [1, 23], "legacy", torch.float32, "seq", "strided"),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"D{c[3]}-bs{c[4]}-{c[6]}-{str(c[7])[6:]}-u{c[8]}-bd{c[9]}")
def test_matches_reference(case, device):
    S, H, Hkv, D, bs, ctx, layout, dtype, u, bd = case
    x = make_inputs(S, H, Hkv, D, bs, ctx, layout, dtype, device, u=u, bd=bd)
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, dtype)
    assert torch.equal(run(x), o)  # return_lse only adds lse


@pytest.mark.parametrize("fuse", [64, 0])
def test_many_splits_nan_poisoned(device, fuse):
    """Small tiles force several splits (some wholly past a short context); every output is written, whether the
    split kernel merges its parts (eager) or a merge launch does (fuse_merge 0, CUDA-graph capture); the shared
    scratch's arrival counters are 0 again after each call."""
    from llmkernels.ops.combine.kernel import _SCRATCH
    for layout in ("nhd", "legacy", "nhd"):
        x = make_inputs(3, 4, 2, 64, 8, [190, 3, 0], layout, torch.float16, device)
        S, H, D = x["q"].shape
        out = torch.full((S, H, D), float("nan"), dtype=torch.float16, device=device)
        lse = torch.full((S, H), float("nan"), device=device)
        for e in _SCRATCH.values():  # parts left by earlier calls: NaN, so a part this call fails to write shows
            e[0].fill_(float("nan"))
        K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"],
                              x["bd"], D ** -0.5, out, lse,
                              config={"block_n": 16, "programs_per_sm": 16, "fuse_merge": fuse})
        assert K._plan(S, 2, x["block_tables"].shape[1] * 8, x["q"].device, 16, 16)[0] >= 4
        _assert_close(x, out, lse, torch.float16)
        assert all(int(e[1].count_nonzero()) == 0 for e in _SCRATCH.values())


def test_split_plan_rounds_down_and_large_calls_merge_apart(monkeypatch):
    # splits round down to the program target (rows x splits <= target where the rows fit: a partial second wave
    # cost 5 points of floor at 64 x 4K on the H200) and cover the span; eager calls reading >= FUSE_MAX_BYTES of K
    # and V leave the merge to a merge launch, as legacy MHA does past 32 parts
    dev = torch.device("cpu")  # (num_sms' stand-in: 4 SMs)
    for rows in (1, 3, 8, 63, 64, 65, 200):
        for span in (16, 1000, 65536):
            splits, chunk = K._plan(rows, 1, span, dev, 64, 16)
            assert splits >= 1 and (splits - 1) * chunk < span <= splits * chunk
            assert rows * splits <= 16 * 4 or splits == 1
    x = make_inputs(2, 4, 2, 64, 8, [190, 77], "nhd", torch.float16, dev)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["u"], x["bd"], 0.125)
    cfg = {"block_n": 16, "programs_per_sm": 16}
    assert K.XLPlan(*args, config=cfg).parts.groups > 0
    monkeypatch.setattr(K, "FUSE_MAX_BYTES", 1024)
    assert K.XLPlan(*args, config=cfg).parts.groups == 0


def test_context_zero_and_empty_table(device):
    x = make_inputs(2, 4, 2, 64, 16, [0, 0], "nhd", torch.float16, device, table_pad=0)
    assert x["block_tables"].shape[1] == 0
    o, lse = run(x, return_lse=True)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_garbage_past_used_blocks_is_ignored(device):
    x = make_inputs(3, 4, 2, 64, 8, [19, 8, 2], "legacy", torch.float16, device, table_pad=3, garbage=True)
    o = run(x)
    x2 = dict(x)
    used = (torch.arange(x["block_tables"].shape[1], device=device)[None, :]
            < ((x["context_lens"] + 7) // 8)[:, None])
    x2["block_tables"] = torch.where(used, x["block_tables"], torch.zeros_like(x["block_tables"]))
    assert torch.equal(run(x2), o)
    run(x, validate=True)  # garbage past the used blocks is valid input


@pytest.mark.parametrize("layout", ["nhd", "legacy"])
def test_out_of_range_block_ids_are_skipped(layout, device):
    """Documented behaviour: a used block with an id outside [0, num_blocks) contributes no token."""
    x = make_inputs(3, 4, 2, 64, 8, [30, 30, 9], layout, torch.float16, device, bd="contig")
    nb = x["k_cache"].shape[0]
    x["block_tables"][0, 1] = nb  # one bad block in the middle
    x["block_tables"][1, :4] = torch.tensor([-1, 2 ** 31 - 1, -(2 ** 31), nb + 7], dtype=torch.int32)  # all bad
    x["block_tables"][2, 1] = -3  # the last, partial block
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, torch.float16)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.isneginf(lse[1]).all()
    # sequence 0 equals attention over its other three blocks (bd's entries shift with the tokens)
    keep = torch.tensor([i for i in range(30) if not 8 <= i < 16], device=device)
    y = make_inputs(1, 4, 2, 64, 8, [22], layout, torch.float16, device, bd="contig")
    y["q"], y["u"], y["bd"] = x["q"][:1], x["u"], x["bd"][:1, :, keep]
    y["k_cache"], y["v_cache"] = x["k_cache"], x["v_cache"]
    y["block_tables"] = x["block_tables"][:1, [0, 2, 3]].contiguous()
    assert rel_err(o[:1], ref(y)[0]) <= OUT_TOL[torch.float16]
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\]"):
        run(x, validate=True)


def test_context_lens_clamped(device):
    """context_lens beyond the table span (or bd's width) and negative ones are clamped on the device."""
    x = make_inputs(3, 4, 2, 64, 16, [40, 40, 40], "nhd", torch.float16, device, table_pad=0, bd="contig")
    x["bd"] = x["bd"][:, :, :35]
    x["context_lens"] = torch.tensor([1000, -4, 33], dtype=torch.int32, device=device)
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, torch.float16)
    assert torch.isneginf(lse[1]).all()
    for bad, what in ((1000, r"context_lens\[0\] = 1000"), (-4, r"context_lens\[0\] = -4"), (36, "outside")):
        x["context_lens"] = torch.tensor([bad, 1, 2], dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match=what):
            run(x, validate=True)


def test_scale_multiplies_bd(device):
    x = make_inputs(2, 4, 4, 64, 16, [20, 7], "nhd", torch.float32, device, bd="contig")
    o, lse = run(x, scale=0.3, return_lse=True)
    _assert_close(x, o, lse, torch.float32, scale=0.3)
    # direct formula for one row: softmax(0.3 * ((q + u) . k + bd)) . v
    kd = x["k_cache"][x["block_tables"][1, 0].long(), :7, 2]  # seq 1, head 2, its 7 tokens (one block)
    vd = x["v_cache"][x["block_tables"][1, 0].long(), :7, 2]
    p = torch.softmax(0.3 * ((x["q"][1, 2] + x["u"][2]) @ kd.T + x["bd"][1, 2, :7]), dim=0)
    assert rel_err(o[1, 2], p @ vd) <= 1e-5


def test_reference_matches_direct_formula(device):
    """The reference itself (its gather, GQA grouping and layouts) against a per-token loop. Both in fp32, summing
    in other orders: the a-priori bound of ~80 chained fp32 operations (64-term dots, a softmax over <= 13, 13-term
    sums) is 80 * 2^-24 = 4.8e-6 of the output's norm (1.0e-6 was seen on the H200)."""
    for layout in ("nhd", "legacy"):
        x = make_inputs(2, 4, 2, 64, 8, [13, 5], layout, torch.float32, device, u="seq", bd="strided")
        o, lse = ref(x)
        k, v = cache_as_nhd(x["k_cache"], x["v_cache"])
        for s in range(2):
            n = int(x["context_lens"][s])
            for h in range(4):
                rows = [(int(x["block_tables"][s, j // 8]), j % 8) for j in range(n)]
                kk = torch.stack([k[b, t, h // 2] for b, t in rows])
                vv = torch.stack([v[b, t, h // 2] for b, t in rows])
                logit = ((x["q"][s, h] + x["u"][s, h]) @ kk.T + x["bd"][s, h, :n]) * 64 ** -0.5
                assert rel_err(o[s, h], torch.softmax(logit, 0) @ vv) < 80 * 2 ** -24
                assert abs(lse[s, h].item() - torch.logsumexp(logit, 0).item()) < 1e-5


def _bad_cases():
    def f(**over):
        return over
    return [
        (f(q=lambda x: x["q"].long()), TypeError, "q must have dtype"),
        (f(q=lambda x: x["q"][..., :48]), ValueError, "head dim D"),
        (f(q=lambda x: x["q"][:, :3]), ValueError, "multiple of the cache's kv heads"),
        (f(q=lambda x: x["q"].transpose(0, 1).contiguous().transpose(0, 1)[..., ::1]), None, None),
        (f(k_cache=lambda x: x["k_cache"].half() if x["k_cache"].dtype != torch.half else x["k_cache"].float()),
         TypeError, "share one dtype"),
        (f(k_cache=lambda x: x["k_cache"][:, :4], v_cache=lambda x: x["v_cache"][:, :4]), ValueError,
         "block_size must be one of"),
        (f(k_cache=lambda x: x["k_cache"][:, :12], v_cache=lambda x: x["v_cache"][:, :12]), ValueError,
         "block_size must be one of"),
        (f(k_cache=lambda x: x["k_cache"][:0], v_cache=lambda x: x["v_cache"][:0]), ValueError, "at least one block"),
        (f(v_cache=lambda x: x["v_cache"][..., :32]), ValueError, "same shape"),
        (f(k_cache=lambda x: x["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)[..., ::2]), ValueError, None),
        (f(block_tables=lambda x: x["block_tables"].long()), TypeError, "block_tables must have dtype"),
        (f(block_tables=lambda x: x["block_tables"][:1]), ValueError, "block_tables must have S=2 rows"),
        (f(context_lens=lambda x: x["context_lens"].float()), TypeError, "context_lens must have dtype"),
        (f(context_lens=lambda x: x["context_lens"][:1]), ValueError, "context_lens must have shape"),
        (f(u=lambda x: x["u"][:2]), ValueError, "u must be"),
        (f(u=lambda x: x["u"].int()), TypeError, "u must have dtype"),
        (f(bd=lambda x: x["bd"][:, :3]), ValueError, "bd must be"),
        (f(bd=lambda x: x["bd"][0]), ValueError, "bd must have 3 dims"),
        (f(scale=lambda x: float("nan")), ValueError, "scale must be finite"),
        (f(scale=lambda x: "0.1"), TypeError, "scale must be a float"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_cases())))
def test_bad_inputs(i, device):
    over, exc, msg = _bad_cases()[i]
    x = make_inputs(2, 4, 2, 64, 16, [20, 9], "nhd", torch.float16, device, bd="contig")
    kw = {}
    for name, fn in over.items():
        if name == "scale":
            kw["scale"] = fn(x)
        else:
            x[name] = fn(x)
    if exc is None:  # a valid non-contiguous q view runs
        assert rel_err(run(x), ref(x)[0]) <= OUT_TOL[torch.float16]
        return
    with pytest.raises(exc, match=msg):
        run(x, **kw)


def test_flags_must_be_bools(device):
    x = make_inputs(2, 4, 2, 64, 16, [20, 9], "nhd", torch.float16, device)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        run(x, return_lse="yes")
    with pytest.raises(TypeError, match="validate must be a bool"):
        run(x, validate=None)  # would skip the check silently


def test_legacy_layout_checks(device):
    x = make_inputs(2, 4, 2, 64, 16, [20, 9], "legacy", torch.float16, device)
    k = x["k_cache"]
    with pytest.raises(ValueError, match="legacy k_cache must be"):
        xl_paged_decode(x["q"], k.view(k.shape[0], 2, 4, 16, 16), x["v_cache"], x["block_tables"], x["context_lens"])
    with pytest.raises(ValueError, match="v_cache must be"):
        xl_paged_decode(x["q"], k, x["v_cache"].transpose(2, 3), x["block_tables"], x["context_lens"])
    with pytest.raises(ValueError, match="contiguous in its last two dims"):
        v = x["v_cache"].transpose(2, 3).contiguous().transpose(2, 3)
        xl_paged_decode(x["q"], k, v, x["block_tables"], x["context_lens"])


def test_torch_compile_fullgraph(device):
    x = make_inputs(2, 4, 2, 64, 16, [21, 4], "legacy", torch.float16, device, bd="contig")
    f = torch.compile(lambda *a: xl_paged_decode(*a, return_lse=True), fullgraph=True, backend="aot_eager")
    o, lse = f(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"], x["bd"])
    _assert_close(x, o, lse, torch.float16)


# --------------------------------------------------------------------------------------------- GPU

def _gpu_matrix():
    cases = []
    bs_for = {64: 8, 80: 16, 96: 32, 128: 64, 256: 16}
    g_for = {64: 1, 80: 2, 96: 4, 128: 8, 256: 1}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for layout in ("nhd", "legacy"):
            for j, D in enumerate((64, 80, 96, 128, 256)):
                u = (None, "head", "seq")[j % 3]
                bd = ("strided", "contig", None)[(j + (layout == "legacy")) % 3]
                cases.append((dtype, layout, D, bs_for[D], g_for[D], u, bd))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gpu_matrix(), ids=str)
def test_gpu_matrix(case):
    dtype, layout, D, bs, G, u, bd = case
    Hkv = 2
    ctx = [0, 1, bs * 3 + 5, 777, 2 * bs, 2500]
    x = make_inputs(len(ctx), Hkv * G, Hkv, D, bs, ctx, layout, dtype, "cuda", u=u, bd=bd, table_pad=2)
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhd", "legacy"])
@pytest.mark.parametrize("bs", [8, 16, 32, 64, 128, 256])
def test_gpu_block_sizes(bs, layout):
    x = make_inputs(4, 16, 16, 128, bs, [bs * 5 + 3, 1, 3000, bs - 1], layout, torch.float16, "cuda", bd="contig")
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhd", "legacy"])
def test_gpu_long_context_and_bad_ids(layout):
    """Bench-like shape (many splits) with garbage past the used blocks and out-of-range used ids."""
    x = make_inputs(3, 16, 16, 128, 16, [20000, 17, 9001], layout, torch.float16, "cuda", bd="contig")
    nb = x["k_cache"].shape[0]
    x["block_tables"][0, 7] = nb
    x["block_tables"][2, 100:110] = -77
    o, lse = run(x, return_lse=True)
    _assert_close(x, o, lse, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhd", "legacy"])
def test_gpu_cuda_graph(layout):
    x = make_inputs(4, 8, 4, 128, 16, [300, 1, 0, 1000], layout, torch.bfloat16, "cuda", bd="strided")
    for _ in range(2):  # compile and warm up outside the capture
        run(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = run(x)
    x2 = make_inputs(4, 8, 4, 128, 16, [300, 1, 0, 1000], layout, torch.bfloat16, "cuda", bd="strided")
    for name in ("q", "k_cache", "v_cache", "u"):
        x[name].copy_(x2[name])
    x["bd"].copy_(x2["bd"])
    x["context_lens"].copy_(torch.tensor([999, 17, 1, 0], dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(o, ref(x)[0]) <= OUT_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_torch_compile_inductor():
    x = make_inputs(2, 8, 2, 128, 16, [100, 33], "nhd", torch.float16, "cuda", bd="contig")
    f = torch.compile(lambda *a: xl_paged_decode(*a) * 2, fullgraph=True)
    o = f(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"], x["bd"])
    assert rel_err(o, 2 * ref(x)[0]) <= OUT_TOL[torch.float16]


def test_reference_no_attended_tokens(device):
    x = make_inputs(1, 2, 2, 64, 8, [0], "nhd", torch.float32, device)
    o, lse = xl_paged_decode_ref(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"])
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("layout", ["nhd", "legacy"])
def test_nan_in_unwritten_cache_slots(layout, device):
    """Slots past the context inside the last used block (and unused blocks) may hold NaN: no effect."""
    x = make_inputs(3, 4, 2, 64, 16, [21, 16, 70], layout, torch.float16, device, extra_blocks=2, bd="contig")
    want = run(x)
    _nan_unwritten_slots(x, layout, 16)
    assert torch.equal(run(x), want)


def _nan_unwritten_slots(x, layout, bs):
    """NaN in every cache slot a correct kernel never uses: past each context inside its last used block, and
    in every block no table lists among its used entries (out-of-range ids skipped)."""
    nb = x["k_cache"].shape[0]
    used = set()
    for s, n in enumerate(x["context_lens"].tolist()):
        nblk = (n + bs - 1) // bs
        used.update(b for b in x["block_tables"][s, :nblk].tolist() if 0 <= b < nb)
        last, start = x["block_tables"][s, nblk - 1].item(), n - (nblk - 1) * bs
        if 0 <= last < nb and start < bs:
            for c in ("k_cache", "v_cache"):  # the block_size dim: 1 (NHD) or 3 (legacy k and v)
                if layout == "nhd":
                    x[c][last, start:] = float("nan")
                else:
                    x[c][last, :, :, start:] = float("nan")
    for b in set(range(nb)) - used:
        x["k_cache"][b] = float("nan")
        x["v_cache"][b] = float("nan")


# v4 candidate variants (selected through the launcher's config; see kernel.default_config)
VARIANTS = [{"mha_path": "reduce"}, {"mha_path": "reduce", "prefetch_table": True},
            {"mha_path": "reduce", "block_n": 16}]
# S, H, Hkv, D, block_size, contexts, layout, dtype, u, bd: G == 1 and G > 1, tails, both layouts
VARIANT_CASES = [
    (3, 4, 4, 64, 16, [37, 1, 0], "legacy", torch.float16, "head", "strided"),
    (3, 4, 4, 80, 8, [50, 17, 64], "nhd", torch.float16, "seq", "contig"),
    (2, 2, 2, 96, 32, [65, 31], "legacy", torch.float32, None, None),
    (2, 2, 2, 64, 8, [33, 16], "nhd", torch.float32, "head", "strided"),
    (2, 4, 2, 128, 16, [70, 9], "legacy", torch.float16, "head", "contig"),
    (2, 6, 2, 64, 64, [129, 3], "legacy", torch.float32, None, "strided"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("case", VARIANT_CASES,
                         ids=lambda c: f"G{c[1] // c[2]}-D{c[3]}-bs{c[4]}-{c[6]}-{str(c[7])[6:]}")
def test_variants_match_reference(case, variant, device):
    """Every variant, NaN-poisoned split buffers and outputs, small tiles so there are several splits and tails."""
    S, H, Hkv, D, bs, ctx, layout, dtype, u, bd = case
    x = make_inputs(S, H, Hkv, D, bs, ctx, layout, dtype, device, u=u, bd=bd)
    out = torch.full((S, H, D), float("nan"), dtype=dtype, device=device)
    lse = torch.full((S, H), float("nan"), device=device)
    cfg = dict({"block_n": 32, "programs_per_sm": 8}, **variant)
    K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"], x["bd"],
                          D ** -0.5, out, lse, config=cfg)
    _assert_close(x, out, lse, dtype)


@pytest.mark.parametrize("variant", VARIANTS[:3], ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("layout", ["nhd", "legacy"])
@pytest.mark.parametrize("G", [1, 2])
def test_variants_bad_ids_and_nan_slots(variant, layout, G, device):
    """Out-of-range used ids skipped, garbage past the used blocks never read, NaN in unwritten slots ignored."""
    H = 4
    x = make_inputs(3, H, H // G, 64, 8, [30, 30, 21], layout, torch.float16, device, bd="contig", extra_blocks=2)
    nb = x["k_cache"].shape[0]
    x["block_tables"][0, 1] = nb
    x["block_tables"][1, :4] = torch.tensor([-1, 2 ** 31 - 1, -(2 ** 31), nb + 7], dtype=torch.int32)
    cfg = dict({"block_n": 16, "programs_per_sm": 4}, **variant)

    def go():
        S, _, D = x["q"].shape
        out = torch.full((S, H, D), float("nan"), dtype=torch.float16, device=device)
        lse = torch.full((S, H), float("nan"), device=device)
        K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"],
                              x["bd"], D ** -0.5, out, lse, config=cfg)
        return out, lse

    o, lse = go()
    _assert_close(x, o, lse, torch.float16)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.isneginf(lse[1]).all()
    _nan_unwritten_slots(x, layout, 8)
    assert torch.equal(go()[0], o)


def test_unknown_variant_rejected(device):
    x = make_inputs(1, 2, 2, 64, 16, [5], "nhd", torch.float16, device)
    with pytest.raises(ValueError, match="unknown variant"):
        K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], None, None,
                              0.1, torch.empty_like(x["q"]), torch.empty(1, 2, device=device),
                              config={"mha_path": "gemv"})
