import math

import pytest
import torch

from llmkernels import kept_lists, masked_decode, merge_attention_states
from llmkernels.checking import rel_err
from llmkernels.ops.combine.reference import merge_attention_states_ref
from llmkernels.ops.masked_decode.kernel import masked_decode_fwd
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import LSE_TOL, OUT_TOL, make_inputs


def _compare(x, kv_len=None, sm_scale=None, dtype=torch.float16):
    o, lse = masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=kv_len, sm_scale=sm_scale)
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kv_len, sm_scale)
    assert o.dtype == x["q"].dtype and lse.dtype == torch.float32
    assert rel_err(o, ro) <= OUT_TOL[dtype], rel_err(o, ro)
    assert rel_err(lse, rl) <= LSE_TOL, rel_err(lse, rl)
    return o, lse


def _poisoned(x, kv_lens, L, cfg=None):
    """The launcher on NaN-filled out / lse (any element it fails to write stays NaN and fails), vs the reference."""
    B, Hq, D = x["q"].shape
    dtype = x["q"].dtype
    out = torch.full((B, Hq, D), float("nan"), dtype=dtype, device=x["q"].device)
    lse = torch.full((B, Hq), float("nan"), dtype=torch.float32, device=x["q"].device)
    masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], kv_lens, L, D ** -0.5, out, lse, cfg)
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kv_lens)
    assert rel_err(out, ro) <= OUT_TOL[dtype] and rel_err(lse, rl) <= LSE_TOL
    return out, lse


# ---- CPU (interpreter) tests: fp16 only, the interpreter's bf16 tl.dot is wrong ----

@pytest.mark.parametrize("B,Hkv,G,L,D", [(2, 2, 4, 157, 64), (1, 3, 1, 33, 128), (2, 1, 16, 70, 64),
                                         (1, 2, 8, 129, 256), (3, 1, 5, 61, 64)])
def test_matches_reference(device, B, Hkv, G, L, D):
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.6)
    _compare(x)


def test_strided_cache_view_and_varlen(device):
    # cache preallocated longer than L and laid out [B, L, Hkv, D]: k/v are non-contiguous views
    B, Hkv, G, L, D = 3, 2, 4, 90, 64
    cache = torch.randn(B, 128, Hkv, 2, D, dtype=torch.float16, device=device)
    k, v = cache[:, :L, :, 0].transpose(1, 2), cache[:, :L, :, 1].transpose(1, 2)
    assert not k.is_contiguous()
    q = torch.randn(B, Hkv * G, 2 * D, dtype=torch.float16, device=device)[:, :, ::2].contiguous()
    drop = torch.rand(B, Hkv, L, device=device) < 0.3
    lens = torch.tensor([90, 1, 47], dtype=torch.int32, device=device)
    _compare({"q": q, "k": k, "v": v, "drop": drop}, kv_len=lens)
    _compare({"q": q, "k": k, "v": v, "drop": drop}, kv_len=55, sm_scale=0.3)


def test_non_contiguous_q(device):
    B, Hkv, G, L, D = 2, 2, 2, 40, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device)
    x["q"] = torch.randn(Hkv * G, B, D, dtype=torch.float16, device=device).transpose(0, 1)
    _compare(x)


def test_all_dropped_and_empty_rows(device):
    B, Hkv, G, L, D = 3, 2, 4, 50, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.5)
    x["drop"][0] = True  # every token of sequence 0 dropped
    x["drop"][1, 1] = True  # one kv head of sequence 1
    lens = torch.tensor([50, 50, 0], dtype=torch.int32, device=device)  # sequence 2 is empty
    o, lse = _compare(x, kv_len=lens)
    assert torch.all(o[0] == 0) and torch.all(o[2] == 0) and torch.all(o[1, G:] == 0)
    assert torch.all(lse[0] == -math.inf) and torch.all(lse[2] == -math.inf) and torch.all(lse[1, G:] == -math.inf)
    assert torch.isfinite(lse[1, :G]).all() and not torch.isnan(o).any()


def test_kv_len_tensor_is_clamped(device):
    x = make_inputs(2, 1, 4, 30, 64, torch.float16, device)
    lens = torch.tensor([-5, 1000], dtype=torch.int32, device=device)  # defined: clamped to [0, L]
    o, lse = masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=lens)
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], torch.tensor([0, 30]))
    assert torch.all(lse[0] == -math.inf) and rel_err(o, ro) <= OUT_TOL[torch.float16]
    # int64 lengths past the int32 range clamp to L too (narrowed first, 2**32 + 3 would read as 3)
    o64, _ = masked_decode(x["q"], x["k"], x["v"], x["drop"],
                           kv_len=torch.tensor([2 ** 32 + 3, 2 ** 40], dtype=torch.int64, device=device))
    ro64, _ = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], torch.tensor([30, 30]))
    assert rel_err(o64, ro64) <= OUT_TOL[torch.float16]


def test_4d_query_and_no_mask(device):
    x = make_inputs(2, 2, 4, 45, 64, torch.float16, device)
    o4, lse4 = masked_decode(x["q"][:, :, None], x["k"], x["v"])
    o3, lse3 = masked_decode(x["q"], x["k"], x["v"])
    assert o4.shape == (2, 4, 1, 64) and torch.equal(o4[:, :, 0], o3) and torch.equal(lse4, lse3)
    ro, _ = masked_decode_ref(x["q"], x["k"], x["v"])
    assert rel_err(o3, ro) <= OUT_TOL[torch.float16]


def test_every_output_written(device):
    # NaN-poisoned outputs: any element the kernels fail to write stays NaN and fails
    B, Hkv, G, L, D = 2, 2, 3, 77, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.7)
    _poisoned(x, None, L)


@pytest.mark.parametrize("cfg", [{"block_n": 128, "num_stages": 2}, {"block_n": 64, "num_stages": 3},
                                 {"block_n": 64, "num_stages": 3, "interleave": False}])
def test_both_tile_configs(device, cfg):
    # the no-mask and the mask configs, each on masked and varlen data; NaN-poisoned outputs
    B, Hkv, G, L, D = 3, 2, 4, 300, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.6)
    x["drop"][-1, -1] = True
    for kl in (None, torch.tensor([300, 1, 0], dtype=torch.int32, device=device)):
        out, lse = _poisoned(x, kl, L, cfg)
        assert torch.all(lse[-1, -G:] == -math.inf) and torch.all(out[-1, -G:] == 0)


@pytest.mark.parametrize("interleave", [True, False])
def test_splits_interleaved_or_contiguous(device, interleave):
    # several splits per row (L > 512 tokens each), a varlen row ending inside the last split's tiles: every tile is
    # attended exactly once whether the splits take tiles in turn or one chunk each
    from llmkernels.ops.masked_decode.kernel import _plan
    B, Hkv, G, L, D = 2, 1, 4, 2600, 64
    assert _plan(B, Hkv, L, torch.device(device), 2)[0] >= 2
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.7)
    for kl in (None, torch.tensor([2600, 1333], dtype=torch.int32, device=device)):
        _poisoned(x, kl, L, {"block_n": 64, "num_stages": 3, "interleave": interleave})


@pytest.mark.parametrize("fuse", [1 << 20, 0])
def test_split_merge_fused_or_launched(device, fuse):
    # eager calls merge the parts inside the split kernel (the last program of a row, by arrival counters it re-arms)
    # or by a merge launch (fuse_merge 0, and CUDA-graph capture): same results; repeated calls and calls of other
    # shapes share the per-stream scratch, whose counters are 0 again after every call. fuse_merge 2^20 merges in
    # the kernel whatever the split count the device's SMs give (G x splits <= fuse_merge)
    from llmkernels.ops.combine.kernel import _SCRATCH
    from llmkernels.ops.masked_decode.kernel import DecodePlan
    B, Hkv, G, L, D = 2, 1, 4, 2600, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.7)
    plan = DecodePlan(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, {"fuse_merge": fuse})
    assert plan.parts.merge is not None and plan.parts.groups == (B * Hkv if fuse else 0)
    for kl in (None, torch.tensor([2600, 700], dtype=torch.int32, device=device), None):
        for e in _SCRATCH.values():  # parts left by earlier calls: NaN, so a part this call fails to write shows
            e[0].fill_(float("nan"))
        _poisoned(x, kl, L, {"fuse_merge": fuse})
        y = make_inputs(1, 2, 2 * G, 1100, D, torch.float16, device, kept=0.5)  # 2 splits, fused or not
        _poisoned(y, None, 1100, {"fuse_merge": fuse})
        assert all(int(e[1].count_nonzero()) == 0 for e in _SCRATCH.values())


def test_empty_cache_frees_the_split_scratch(device):
    import llmkernels
    from llmkernels.ops.combine.kernel import _SCRATCH
    x = make_inputs(1, 2, 8, 1100, 64, torch.float16, device, kept=0.5)  # 2 splits: parts in the scratch
    o, _ = _compare(x)
    assert _SCRATCH
    llmkernels.empty_cache()
    assert not _SCRATCH
    assert torch.equal(_compare(x)[0], o)  # allocated again, same result


def test_empty_batch(device):
    q = torch.randn(0, 4, 64, dtype=torch.float16, device=device)
    k = torch.randn(0, 2, 10, 64, dtype=torch.float16, device=device)
    o, lse = masked_decode(q, k, k)
    assert o.shape == (0, 4, 64) and lse.shape == (0, 4)


def test_merge_matches_unsharded(device):
    x = make_inputs(2, 2, 8, 150, 64, torch.float16, device, kept=0.8)
    bounds = [(0, 37), (37, 38), (38, 150)]
    parts = [masked_decode(x["q"], x["k"][:, :, a:b], x["v"][:, :, a:b], x["drop"][:, :, a:b]) for a, b in bounds]
    mo, ml = merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])
    assert mo.dtype == torch.float16 and rel_err(mo, ro) <= OUT_TOL[torch.float16] and rel_err(ml, rl) <= LSE_TOL


def test_merge_with_empty_parts(device):
    outs = torch.randn(4, 5, 3, 64, device=device)
    lses = torch.randn(4, 5, 3, device=device)
    lses[1] = -math.inf  # a shard that saw no key
    lses[:, 0, 0] = -math.inf  # a row no shard saw
    mo, ml = merge_attention_states(outs, lses)
    ro, rl = merge_attention_states_ref(outs, lses)
    assert torch.all(mo[0, 0] == 0) and ml[0, 0] == -math.inf
    assert rel_err(mo, ro) <= 1e-5 and rel_err(ml, rl) <= 1e-6  # fp32 in and out: rounding only


def test_merge_plus_inf_parts_contribute_nothing(device):
    """lse = +inf (sparse_mla's row with no valid index) is a part with no key, like -inf."""
    outs = torch.randn(3, 4, 2, 64, device=device)
    lses = torch.randn(3, 4, 2, device=device)
    lses[0, :2] = math.inf
    lses[:, 3, 1] = math.inf  # a row no part saw
    mo, ml = merge_attention_states(outs, lses)
    ro, rl = merge_attention_states_ref(outs, lses.masked_fill(lses == math.inf, -math.inf))
    assert not mo.isnan().any() and torch.all(mo[3, 1] == 0) and ml[3, 1] == -math.inf
    assert rel_err(mo, ro) <= 1e-5 and rel_err(ml, rl) <= 1e-6  # fp32 in and out: rounding only


@pytest.mark.parametrize("S,D", [(3, 64), (70, 128), (40, 256), (129, 72)])
@pytest.mark.parametrize("slices", [0, 512])
def test_merge_one_shot_and_looped(device, monkeypatch, S, D, slices):
    # S * D <= 8192 merges all parts at once, larger merges loop over parts, or (SLICE_PARTS) take all parts at once
    # in slices of D (the last one partial at D 72): every path, empty parts holding NaN
    from llmkernels import _launch
    from llmkernels.ops.combine import kernel as ck
    monkeypatch.setattr(ck, "SLICE_PARTS", slices)
    monkeypatch.setattr(_launch, "_PLANS", _launch.PlanCache())
    outs = torch.randn(S, 2, 3, D, device=device)
    lses = torch.randn(S, 2, 3, device=device) * 3
    lses[1] = -math.inf
    outs[1] = float("nan")  # a part with zero weight is never used
    mo, ml = merge_attention_states(outs, lses)
    ro, rl = merge_attention_states_ref(outs.nan_to_num(), lses)
    assert rel_err(mo, ro) <= 1e-5 and rel_err(ml, rl) <= 1e-6  # fp32 in and out: rounding only


@pytest.mark.parametrize("D", [1, 72, 1024])
@pytest.mark.parametrize("ldtype", [torch.float32, torch.bfloat16])
def test_merge_two_parts_in_place(device, D, ldtype):
    # two separate contiguous parts go to the two-pointer kernel (no stack): the same result as the stacked merge
    outs = torch.randn(2, 3, 5, D, device=device)
    lses = (torch.randn(2, 3, 5, device=device) * 3).to(ldtype)
    lses[0, 0] = -math.inf          # part 0 saw no key in these rows
    lses[1, 1, :2] = math.inf       # nor part 1 here (sparse_mla's marker)
    lses[:, 2, 4] = -math.inf       # a row no part saw
    outs[0, 0] = float("nan")       # a part with zero weight is never read
    mo, ml = merge_attention_states([outs[0].clone(), outs[1].clone()], [lses[0].clone(), lses[1].clone()])
    so, sl = merge_attention_states(outs, lses)
    ro, rl = merge_attention_states_ref(outs.nan_to_num(), lses.masked_fill(lses == math.inf, -math.inf))
    assert torch.all(mo[2, 4] == 0) and ml[2, 4] == -math.inf and not mo.isnan().any()
    assert rel_err(mo, ro) <= 1e-5 and rel_err(ml, rl) <= 1e-6  # fp32 out: rounding only
    assert rel_err(mo, so) <= 1e-6 and rel_err(ml, sl) <= 1e-6  # the stacked kernel's arithmetic (FMA order aside)
    # a strided part takes the stacked path; a NaN lse makes its row NaN
    lses[1, 0, 3] = float("nan")
    mo, ml = merge_attention_states([outs[0], outs[1, :, :, :].transpose(0, 1).contiguous().transpose(0, 1)],
                                    [lses[0].clone(), lses[1].clone()])
    assert mo[0, 3].isnan().all() and ml[0, 3].isnan() and not mo[1].isnan().any()


def test_torch_compile_fullgraph(device):
    x = make_inputs(2, 2, 4, 40, 64, torch.float16, device, kept=0.5)
    lens = torch.tensor([40, 17], dtype=torch.int32, device=device)

    def f(q, k, v, m, n):
        o, lse = masked_decode(q, k, v, m, kv_len=n)
        return o.float() * 2, lse

    backend = "inductor" if device.type == "cuda" else "aot_eager"
    co, cl = torch.compile(f, fullgraph=True, backend=backend)(x["q"], x["k"], x["v"], x["drop"], lens)
    eo, el = f(x["q"], x["k"], x["v"], x["drop"], lens)
    assert torch.equal(co, eo) and torch.equal(cl, el)


def test_opcheck(device):
    x = make_inputs(1, 2, 4, 20, 64, torch.float16, device, kept=0.5)
    torch.library.opcheck(torch.ops.llmkernels.masked_decode.default,
                          (x["q"], x["k"], x["v"], x["drop"], None, 20, 0.125),
                          test_utils=("test_schema", "test_faketensor"))


# ---- kept lists (kept_idx / kept_len / dense_from): the mask's tokens listed, time in their number ----

def _lists(x, L0):
    """kept_lists of the first L0 positions' mask, rows' entries shuffled past their count (order is free)."""
    idx, n = kept_lists(x["drop"][:, :, :L0].contiguous())
    perm = torch.argsort(torch.rand(idx.shape, device=idx.device), dim=-1)
    shuffled = torch.gather(idx, 2, perm)
    first = torch.arange(idx.shape[2], device=idx.device) < n[..., None]
    kept_first = torch.gather(idx, 2, torch.argsort(torch.rand(idx.shape, device=idx.device) + 2 * ~first, dim=-1))
    return idx, n, shuffled, kept_first


@pytest.mark.parametrize("B,Hkv,G,L,D,L0", [(2, 2, 4, 157, 64, 120), (1, 3, 1, 33, 128, 33), (2, 1, 16, 70, 64, 0),
                                            (1, 2, 8, 129, 256, 100)])
def test_kept_lists_match_the_mask(device, B, Hkv, G, L, D, L0):
    """Lists of a mask's first L0 positions plus every later one (dense_from=L0) = the mask whose later positions
    are kept; the lists' order within a row does not matter; kv_len caps both parts."""
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device, kept=0.4)
    idx, n, _, kept_first = _lists(x, L0)
    mask = x["drop"].clone()
    mask[:, :, L0:] = False
    for lens in (None, torch.tensor([L - 5, 3][:B], dtype=torch.int32, device=device)):
        for lists in (idx, kept_first):
            o, lse = masked_decode(x["q"], x["k"], x["v"], kv_len=lens, kept_idx=lists, kept_len=n, dense_from=L0)
            ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], mask, lens)
            assert rel_err(o, ro) <= OUT_TOL[torch.float16] and rel_err(lse, rl) <= LSE_TOL
        mo, ml = masked_decode(x["q"], x["k"], x["v"], mask, kv_len=lens)
        assert rel_err(o, mo) <= OUT_TOL[torch.float16] and rel_err(lse, ml) <= LSE_TOL


@pytest.mark.parametrize("config", [None, {"list_ahead": False}, {"heavy_first": True},
                                    {"balance": 1, "balance_waves": 3, "waves": 8},
                                    {"balance": 2, "heavy_first": True, "block_n": 16, "waves": 8}])
def test_kept_lists_garbage_entries_are_skipped(device, config):
    """Entries outside [0, min(dense_from, kv_len)), counts outside [0, M] and repeats follow the documented rules
    (the reference's), NaN-poisoned outputs fully written; an empty row gives out 0, lse -inf. Both ways of loading
    a tile's entries (one iteration ahead, the default; in the iteration); rows launched longest first; splits
    balanced by the rows' counts (garbage counts clamped as the rows read them)."""
    B, Hkv, G, L, D = 2, 2, 4, 90, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device)
    M = 40
    idx = torch.randint(-5, L + 5, (B, Hkv, M), dtype=torch.int32, device=device)
    idx[0, 0, :4] = torch.tensor([-2 ** 31, 2 ** 31 - 1, 60, 60], dtype=torch.int32)  # extremes; 60 listed twice
    n = torch.tensor([[M, 7], [-3, M + 100]], dtype=torch.int32, device=device)  # row (1, 0): nothing listed
    for dense_from, kv_len in ((70, None), (L, 50), (0, None)):
        out = torch.full((B, Hkv * G, D), float("nan"), dtype=torch.float16, device=device)
        lse = torch.full((B, Hkv * G), float("nan"), device=device)
        masked_decode_fwd(x["q"], x["k"], x["v"], None, None if kv_len is None else
                          torch.full((B,), kv_len, dtype=torch.int32, device=device), L, D ** -0.5, out, lse,
                          config=config, kept=(idx, n, dense_from))
        ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], None, kv_len, None, idx, n, dense_from)
        assert rel_err(out, ro) <= OUT_TOL[torch.float16] and rel_err(lse, rl) <= LSE_TOL
    o, lse = masked_decode(x["q"], x["k"], x["v"], kept_idx=idx, kept_len=n, dense_from=L)
    assert torch.all(o[1, :G] == 0) and torch.all(lse[1, :G] == -math.inf)


def test_kept_lists_nan_and_strided(device):
    """NaN in a listed row makes its (sequence, KV head)'s rows NaN; in a row the lists skip it changes nothing;
    lists and counts as strided views."""
    B, Hkv, G, L, D = 2, 2, 2, 64, 64
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device)
    big = torch.full((B, Hkv, 2 * L), -7, dtype=torch.int32, device=device)
    idx = big[:, :, ::2]  # stride 2
    idx.copy_(torch.arange(L, dtype=torch.int32, device=device).expand(B, Hkv, L))
    n = torch.tensor([[10, 20], [30, 40]], dtype=torch.int32, device=device).t().contiguous().t()  # column-major
    x["k"][0, 1, 15] = float("nan")  # listed (15 < 20) for (0, 1)
    x["k"][1, 0, 50] = float("nan")  # past row (1, 0)'s 20 entries: skipped
    o, lse = masked_decode(x["q"], x["k"], x["v"], kept_idx=idx, kept_len=n)
    assert o[0, G:].isnan().all() and lse[0, G:].isnan().all()
    rest = torch.cat([o[0, :G], o[1]]).float()
    assert not rest.isnan().any()
    ro, _ = masked_decode_ref(x["q"], x["k"], x["v"], None, None, None, idx, n)
    assert rel_err(rest, torch.cat([ro[0, :G], ro[1]])) <= OUT_TOL[torch.float16]


@pytest.mark.parametrize("config", [None, {"block_n": 32, "waves": 16}, {"heavy_first": True, "waves": 3},
                                    {"balance": 1, "block_n": 16, "waves": 16, "balance_waves": 5},
                                    {"balance": 2, "block_n": 16, "waves": 16},
                                    {"balance": 1, "block_n": 16, "waves": 16, "balance_cap": 1.0}])
def test_kept_prefix_matches_lists(device, config):
    """kept_len without kept_idx (a compacted cache: each row's kept tokens at its front) = the lists 0 .. n - 1, and
    the reference; counts below 0 or past dense_from, kv_len below dense_from, NaN-poisoned outputs fully written,
    an empty row out 0 / lse -inf; NaN in a row's prefix makes it NaN, past its count changes nothing."""
    B, Hkv, G, L, D, W = 2, 3, 4, 150, 64, 100
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device)
    n = torch.tensor([[37, 0, W + 50], [-4, 100, 64]], dtype=torch.int32, device=device)
    x["k"][1, 1, 20] = float("nan")  # in row (1, 1)'s prefix
    x["k"][1, 2, 80] = float("nan")  # past row (1, 2)'s 64 (and below dense_from): skipped
    front = torch.arange(W, dtype=torch.int32, device=device).expand(B, Hkv, W).contiguous()
    for lens in (None, torch.tensor([L - 3, 50], dtype=torch.int32, device=device)):
        out = torch.full((B, Hkv * G, D), float("nan"), dtype=torch.float16, device=device)
        lse = torch.full((B, Hkv * G), float("nan"), device=device)
        masked_decode_fwd(x["q"], x["k"], x["v"], None, lens, L, D ** -0.5, out, lse, config=config,
                          kept=(None, n, W))
        lo, ll = masked_decode(x["q"], x["k"], x["v"], kv_len=lens, kept_idx=front, kept_len=n, dense_from=W)
        ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], None, lens, None, None, n, W)
        rows = torch.ones(B, Hkv * G, dtype=torch.bool, device=device)
        rows[1, G:2 * G] = False  # (1, 1): NaN
        assert out[1, G:2 * G].isnan().all() and not out[rows].isnan().any()
        assert rel_err(out[rows], ro[rows]) <= OUT_TOL[torch.float16] and rel_err(out[rows], lo[rows]) <= 1e-3
        assert rel_err(lse[rows], rl[rows]) <= LSE_TOL
    o, lse = masked_decode(x["q"], x["k"], x["v"], kv_len=50, kept_len=n, dense_from=W)  # (1, 0): nothing kept
    assert torch.all(o[1, :G] == 0) and torch.all(lse[1, :G] == -math.inf)


@pytest.mark.parametrize("balance", [1, 2])
@pytest.mark.parametrize("fuse", [0, 1 << 20])
def test_kept_balanced_splits(device, balance, fuse):
    """balance: each row takes splits in proportion to its tokens (here ~6 / 5, 1, 2 / 1 and 1 of 8), its readers
    marking its unused slots empty (the scratch's stale parts NaN: a slot left unmarked shows); merged by a launch or
    in the kernel; lists and prefixes match the reference, new tokens past dense_from included, per-sequence lengths
    read on the device."""
    from llmkernels.ops.combine.kernel import _SCRATCH
    B, Hkv, G, L, D, W = 2, 2, 2, 1024, 64, 1000
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.float16, device)
    n = torch.tensor([[900, 50], [300, 0]], dtype=torch.int32, device=device)
    idx = torch.stack([torch.randperm(W, device=device)[:W].int() for _ in range(B * Hkv)]).view(B, Hkv, W)
    cfg = {"balance": balance, "block_n": 16, "waves": 16, "balance_waves": 2, "fuse_merge": fuse}
    for kept in ((idx, n, W), (None, n, W)):
        for lens in (None, torch.tensor([L, W - 7], dtype=torch.int32, device=device)):
            for e in _SCRATCH.values():
                e[0].fill_(float("nan"))
            out = torch.full((B, Hkv * G, D), float("nan"), dtype=torch.float16, device=device)
            lse = torch.full((B, Hkv * G), float("nan"), device=device)
            masked_decode_fwd(x["q"], x["k"], x["v"], None, lens, L, D ** -0.5, out, lse, config=cfg, kept=kept)
            ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], None, None if lens is None else lens, None, *kept)
            assert rel_err(out, ro) <= OUT_TOL[torch.float16] and rel_err(lse, rl) <= LSE_TOL


def test_kept_lists_compile_and_opcheck(device):
    x = make_inputs(2, 2, 4, 40, 64, torch.float16, device, kept=0.5)
    idx, n = kept_lists(x["drop"][:, :, :30].contiguous())

    def f(q, k, v, i, c):
        o, lse = masked_decode(q, k, v, kept_idx=i, kept_len=c, dense_from=30)
        return o.float() * 2, lse

    co, cl = torch.compile(f, fullgraph=True, backend="aot_eager")(x["q"], x["k"], x["v"], idx, n)
    eo, el = f(x["q"], x["k"], x["v"], idx, n)
    assert torch.equal(co, eo) and torch.equal(cl, el)
    torch.library.opcheck(torch.ops.llmkernels.masked_decode.default,
                          (x["q"], x["k"], x["v"], None, None, 40, 0.125, idx, n, 30),
                          test_utils=("test_schema", "test_faketensor"))
    pre = torch.compile(lambda q, k, v, c: masked_decode(q, k, v, kept_len=c, dense_from=30), fullgraph=True,
                        backend="aot_eager")(x["q"], x["k"], x["v"], n)  # a prefix (no kept_idx)
    assert torch.equal(pre[0], masked_decode(x["q"], x["k"], x["v"], kept_len=n, dense_from=30)[0])


# ---- bad inputs: each must raise a clear error naming the argument ----

def _ok(device):
    return make_inputs(2, 2, 8, 16, 64, torch.float16, device)


BAD = [
    ("q dtype", lambda x: dict(q=x["q"].float()), TypeError, "q must have dtype"),
    ("q/k dtype mismatch", lambda x: dict(k=x["k"].to(torch.bfloat16)), TypeError, "share one dtype"),
    ("Hq % Hkv", lambda x: dict(q=x["q"][:, :7]), ValueError, "multiple of k/v heads"),
    ("head dim", lambda x: dict(q=x["q"][..., :32], k=x["k"][..., :32], v=x["v"][..., :32]), ValueError, "head dim D"),
    ("mask shape", lambda x: dict(drop_mask=x["drop"][:, :, :5]), ValueError, "drop_mask must have shape"),
    ("mask dtype", lambda x: dict(drop_mask=x["drop"].to(torch.uint8)), TypeError, "drop_mask must have dtype"),
    ("kv_len > L", lambda x: dict(kv_len=17), ValueError, "kv_len must be in"),
    ("kv_len < 0", lambda x: dict(kv_len=-1), ValueError, "kv_len must be in"),
    ("kv_len tensor shape", lambda x: dict(kv_len=torch.tensor([3], dtype=torch.int32)), ValueError,
     "kv_len must have shape"),
    ("kv_len float", lambda x: dict(kv_len=3.0), TypeError, "kv_len must be None"),
    ("non-unit stride", lambda x: dict(k=x["k"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
     "unit stride"),
    ("k/v shape", lambda x: dict(v=x["v"][:, :, :10]), ValueError, "same shape"),
    ("batch mismatch", lambda x: dict(q=x["q"][:1]), ValueError, "batch"),
    ("q rank", lambda x: dict(q=x["q"][0]), ValueError, "q must have 3 or 4 dims"),
    ("q 4-d with 2 tokens", lambda x: dict(q=x["q"][:, :, None].expand(-1, -1, 2, -1)), ValueError, "one new token"),
    ("device", lambda x: dict(drop_mask=x["drop"].to("meta")), ValueError, "device"),
    ("sm_scale nan", lambda x: dict(sm_scale=float("nan")), ValueError, "sm_scale must be finite"),
    ("k not a tensor", lambda x: dict(k=x["k"].tolist()), TypeError, "k must be a torch.Tensor"),
    ("kept lists and mask", lambda x: dict(kept_idx=kept_lists(x["drop"])[0], kept_len=kept_lists(x["drop"])[1]),
     ValueError, "not both"),
    ("kept_idx alone", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0]), ValueError,
     "kept_idx needs kept_len"),
    ("prefix and mask", lambda x: dict(kept_len=kept_lists(x["drop"])[1]), ValueError, "not both"),
    ("dense_from alone", lambda x: dict(dense_from=3), ValueError, "dense_from goes with"),
    ("kept_idx dtype", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0].long(),
                                      kept_len=kept_lists(x["drop"])[1]), TypeError, "kept_idx must have dtype"),
    ("kept_idx shape", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0][:1],
                                      kept_len=kept_lists(x["drop"])[1]), ValueError, "kept_idx must be"),
    ("kept_len shape", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0],
                                      kept_len=kept_lists(x["drop"])[1][0]), ValueError, "kept_len must have shape"),
    ("dense_from > L", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0],
                                      kept_len=kept_lists(x["drop"])[1], dense_from=17), ValueError,
     "dense_from must be"),
    ("dense_from float", lambda x: dict(drop_mask=None, kept_idx=kept_lists(x["drop"])[0],
                                        kept_len=kept_lists(x["drop"])[1], dense_from=3.0), TypeError,
     "dense_from must be an int"),
]


@pytest.mark.parametrize("name,change,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(device, name, change, exc, msg):
    x = _ok(device)
    args = dict(q=x["q"], k=x["k"], v=x["v"], drop_mask=x["drop"])
    args.update(change(x))
    with pytest.raises(exc, match=msg):
        masked_decode(**args)


def test_merge_bad_inputs(device):
    with pytest.raises(ValueError, match="lses must have shape"):
        merge_attention_states(torch.randn(2, 3, 8), torch.randn(2, 4))
    with pytest.raises(TypeError, match="outs must have dtype"):
        merge_attention_states(torch.randn(2, 3, 8).to(torch.int32), torch.randn(2, 3))
    with pytest.raises(ValueError, match="at least one"):
        merge_attention_states([], [])
    o, l = torch.randn(3, 8), torch.randn(3)
    with pytest.raises(ValueError, match=r"outs\[1\] has shape"):
        merge_attention_states([o, torch.randn(4, 8)], [l, l])
    with pytest.raises(TypeError, match=r"lses must be a tensor"):
        merge_attention_states([o, o], None)
    with pytest.raises(ValueError, match="D >= 1"):
        merge_attention_states(torch.randn(2, 3, 0), torch.randn(2, 3))


# ---- GPU tests ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G", [1, 4, 8, 16])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_matrix(dtype, G, D):
    B, Hkv, L = 3, 2, 3001  # odd length, several splits
    x = make_inputs(B, Hkv, Hkv * G, L, D, dtype, torch.device("cuda"), kept=0.6, cache_len=4096)
    x["drop"][1, 0] = True  # an all-dropped (sequence, kv head)
    lens = torch.tensor([3001, 1234, 0], dtype=torch.int32, device="cuda")
    _compare(x, kv_len=lens, dtype=dtype)
    _compare(x, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{"block_n": 128, "num_stages": 2}, {"block_n": 64, "num_stages": 3}])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G,D", [(1, 64), (4, 128), (8, 256), (16, 128)])
def test_gpu_configs_poisoned(cfg, dtype, G, D):
    B, Hkv, L = 3, 2, 30001
    x = make_inputs(B, Hkv, Hkv * G, L, D, dtype, torch.device("cuda"), kept=0.6, cache_len=32768)
    x["drop"][1, 0] = True
    for lens in (None, torch.tensor([30001, 1234, 0], dtype=torch.int32, device="cuda")):
        _poisoned(x, lens, L, cfg)


@pytest.mark.gpu
def test_gpu_poisoned_long():
    B, Hkv, G, L, D = 1, 8, 4, 70001, 128
    x = make_inputs(B, Hkv, Hkv * G, L, D, torch.bfloat16, torch.device("cuda"), kept=0.5)
    _poisoned(x, None, L)


@pytest.mark.gpu
def test_gpu_cuda_graph():
    x = make_inputs(4, 8, 32, 5000, 128, torch.float16, torch.device("cuda"), kept=0.5)
    lens = torch.tensor([5000, 3, 2500, 0], dtype=torch.int32, device="cuda")
    masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=lens)  # compile before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, lse = masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=lens)
    for _ in range(2):  # new data in the same buffers, replayed
        x["q"].copy_(torch.randn_like(x["q"]))
        x["drop"].copy_(torch.rand(x["drop"].shape, device="cuda") < 0.4)
        lens.copy_(torch.randint(0, 5001, (4,), dtype=torch.int32, device="cuda"))
        g.replay()
        ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], lens)
        assert rel_err(o, ro) <= OUT_TOL[torch.float16] and rel_err(lse, rl) <= LSE_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G,D", [(1, 64), (4, 128), (8, 256)])
def test_gpu_kept_lists(dtype, G, D):
    """Lists of an AdaKV-like mask (per-head kept fractions 0.1-0.9) at 30K, new tokens past dense_from, equal to
    the mask; NaN-poisoned outputs; a CUDA graph replayed with new lists and counts (read on the device); the kept
    tokens compacted, read as a prefix."""
    B, Hkv, L, L0 = 2, 4, 30001, 29000
    x = make_inputs(B, Hkv, Hkv * G, L, D, dtype, torch.device("cuda"), cache_len=32768)
    frac = torch.rand(B, Hkv, 1, device="cuda") * 0.8 + 0.1
    x["drop"] = torch.rand(B, Hkv, L, device="cuda") >= frac
    x["drop"][:, :, L0:] = False
    idx, n = kept_lists(x["drop"][:, :, :L0].contiguous())
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])
    out = torch.full(x["q"].shape, float("nan"), dtype=dtype, device="cuda")
    lse = torch.full(x["q"].shape[:2], float("nan"), device="cuda")
    masked_decode_fwd(x["q"], x["k"], x["v"], None, None, L, D ** -0.5, out, lse, kept=(idx, n, L0))
    assert rel_err(out, ro) <= OUT_TOL[dtype] and rel_err(lse, rl) <= LSE_TOL
    o, _ = masked_decode(x["q"], x["k"], x["v"], kept_idx=idx, kept_len=n, dense_from=L0)  # before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, lse = masked_decode(x["q"], x["k"], x["v"], kept_idx=idx, kept_len=n, dense_from=L0)
    drop = torch.rand(B, Hkv, L, device="cuda") < 0.7
    drop[:, :, L0:] = False
    i2, n2 = kept_lists(drop[:, :, :L0].contiguous())
    idx.copy_(i2)
    n.copy_(n2)
    g.replay()
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], drop)
    assert rel_err(o, ro) <= OUT_TOL[dtype] and rel_err(lse, rl) <= LSE_TOL
    # the same tokens compacted (each row's kept ones at its front, as PressDecoder(compact=True)): a prefix
    width = int(n.max())
    gi = idx[..., :width].long()[..., None].expand(B, Hkv, width, D)
    kc = torch.cat([x["k"].gather(2, gi), x["k"][:, :, L0:]], dim=2)
    vc = torch.cat([x["v"].gather(2, gi), x["v"][:, :, L0:]], dim=2)
    o, lse = masked_decode(x["q"], kc, vc, kept_len=n, dense_from=width)
    assert rel_err(o, ro) <= OUT_TOL[dtype] and rel_err(lse, rl) <= LSE_TOL


@pytest.mark.gpu
def test_gpu_merge_context_parallel():
    x = make_inputs(2, 8, 32, 20000, 128, torch.bfloat16, torch.device("cuda"), kept=0.5)
    cuts = [0, 6000, 6001, 13000, 20000]
    parts = [masked_decode(x["q"], x["k"][:, :, a:b], x["v"][:, :, a:b], x["drop"][:, :, a:b])
             for a, b in zip(cuts, cuts[1:])]
    mo, ml = merge_attention_states(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])
    assert rel_err(mo, ro) <= OUT_TOL[torch.bfloat16] and rel_err(ml, rl) <= LSE_TOL


def test_cpu_tensors_need_the_interpreter(device, monkeypatch):
    # outside the interpreter the kernels cannot read host memory: a clear error, not a crash
    import llmkernels._validate as v
    monkeypatch.setattr(v, "interpreting", lambda: False)
    x = make_inputs(1, 1, 4, 8, 64, torch.float16, torch.device("cpu"))
    with pytest.raises(ValueError, match="kernels run on CUDA devices"):
        masked_decode(x["q"], x["k"], x["v"])


def test_kept_rows_split_by_row_splits(monkeypatch):
    """Kept lists / prefixes aim at ~32 splits a row (rows of unequal length balance over short programs), between
    their configs' waves (4 lists, 2 prefixes) and 16 waves: on 132 SMs 64 rows -> 32 splits (15.5 waves), one
    sequence's 8 rows -> 4 waves (66) or 2 (33); chunks stay >= MIN_CHUNK."""
    from llmkernels.ops.masked_decode import kernel
    from llmkernels.ops.masked_decode.kernel import LISTED_CONFIG, MIN_CHUNK, PREFIX_CONFIG, _plan
    monkeypatch.setattr(kernel, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    lists = lambda B, L: _plan(B, 8, L, cpu, LISTED_CONFIG.waves, LISTED_CONFIG.row_splits)[0]  # noqa: E731
    prefix = lambda B, L: _plan(B, 8, L, cpu, PREFIX_CONFIG.waves, PREFIX_CONFIG.row_splits)[0]  # noqa: E731
    assert (lists(8, 32768), lists(4, 65536), lists(1, 131072)) == (32, 32, 66)
    assert (prefix(8, 32768), prefix(4, 65536), prefix(1, 131072)) == (32, 32, 33)
    assert lists(64, 32768) == 4 and lists(1, 1000) == math.ceil(1000 / MIN_CHUNK)  # 16 waves at most; short rows
    assert _plan(1, 8, 131072, cpu, 2)[0] == 33  # without row_splits: waves alone, as the dense path plans
