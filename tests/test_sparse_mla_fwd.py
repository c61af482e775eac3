"""sparse_mla forward, FlashMLA drop-in, attention distribution and indexer KL loss vs the fp32 references.

CPU: Triton interpreter, fp16 (the interpreter's bf16 dot is wrong), tiny shapes. GPU (@gpu): bf16, larger.
"""
import math

import pytest
import torch

from llmkernels import (flash_mla_sparse_fwd, indexer_kl_loss, merge_attention_states, sparse_mla,
                        sparse_mla_attn_dist, sparse_mla_bwd)
from llmkernels.checking import rel_err
from llmkernels.ops.sparse_mla.attn_dist import attn_dist_launch
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.fwd import sparse_mla_fwd_launch
from llmkernels.ops.sparse_mla.reference import (indexer_kl_loss_ref, sparse_mla_attn_dist_ref,
                                                 sparse_mla_fwd_ref, valid_mask)
from llmkernels.ops.sparse_mla.spec import OUT_TOL, STAT_TOL, causal_indices

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1
gpu = pytest.mark.gpu


def _dtype(device):
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _inputs(device, s_q, s_kv, h_q, topk, d_qk=576, lo=-3, hi=None):
    dt = _dtype(device)
    q = torch.randn(s_q, h_q, d_qk, device=device).to(dt)
    kv = torch.randn(s_kv, 1, d_qk, device=device).to(dt)
    hi = s_kv + 3 if hi is None else hi
    idx = torch.randint(lo, hi, (s_q, topk), dtype=torch.int32, device=device)
    return q, kv, idx


def _check_fwd(got, ref, dtype):
    o, m, l = got
    ro, rm, rl = ref
    assert o.dtype == dtype and m.dtype == torch.float32 and l.dtype == torch.float32
    # tolerances: see spec.OUT_TOL / STAT_TOL (P rounded to the input dtype before P @ V; stats are fp32)
    assert rel_err(o, ro) <= OUT_TOL[dtype], rel_err(o, ro)
    assert rel_err(m, rm) <= STAT_TOL, rel_err(m, rm)
    assert rel_err(l, rl) <= STAT_TOL, rel_err(l, rl)


def _both(q, kv, idx, sc, **kw):
    return sparse_mla(q, kv, idx, sc, **kw), sparse_mla_fwd_ref(q, kv, idx, sc, **kw)


# --- forward: CPU (interpreter) -------------------------------------------------------------------

@pytest.mark.parametrize("h_q,topk,d_qk", [(1, 5, 576), (8, 37, 576), (16, 70, 512), (3, 64, 576)])
def test_fwd_matches_reference(device, h_q, topk, d_qk):
    q, kv, idx = _inputs(device, 6, 50, h_q, topk, d_qk)
    got, ref = _both(q, kv, idx, 0.07)
    _check_fwd(got, ref, q.dtype)


def test_fwd_skv_smaller_than_topk_duplicates_and_empty_rows(device):
    q, kv, idx = _inputs(device, 5, 7, 4, 40)  # s_kv < topk: many duplicates, all counted
    idx[1] = -1                               # a row with no valid index
    idx[2] = 3                                # one token listed 40 times
    got, ref = _both(q, kv, idx, 0.1)
    _check_fwd(got, ref, q.dtype)
    o, m, l = got
    assert torch.all(o[1] == 0) and torch.all(l[1] == float("inf")) and torch.all(m[1] == float("-inf"))
    # 40 copies of one token: the output is exactly that token's value row, up to rounding
    assert rel_err(o[2], kv[3, 0, :512].float().expand(4, 512)) <= OUT_TOL[q.dtype]


def test_fwd_invalid_values_over_int32_range(device):
    q, kv, idx = _inputs(device, 4, 30, 5, 33, lo=0, hi=30)
    bad = torch.tensor([-1, 30, I32_MIN, I32_MAX, -2, 31, I32_MIN + 1, 1 << 30], dtype=torch.int32, device=device)
    idx[:, ::3] = bad[torch.randint(0, len(bad), (4, idx[:, ::3].shape[1]), device=device)]
    idx[3] = bad[torch.arange(33, device=device) % len(bad)]  # a row of garbage only
    got, ref = _both(q, kv, idx, 0.08)
    _check_fwd(got, ref, q.dtype)
    assert torch.all(got[2][3] == float("inf"))


def test_fwd_index_shards_merge(device):
    """Splitting a row's indices over two calls (context parallel) and merging gives the one-call result; a shard
    with no valid index for a row (lse +inf) contributes nothing, and a row no shard saw merges to out 0, lse -inf."""
    q, kv, idx = _inputs(device, 5, 50, 3, 40, lo=0, hi=50)
    idx[1, :20] = -1  # shard 0 sees nothing of row 1
    idx[2] = -1  # no shard sees row 2
    one = sparse_mla(q, kv, idx, 0.1)
    parts = [sparse_mla(q, kv, idx[:, a:b].contiguous(), 0.1) for a, b in ((0, 20), (20, 40))]
    mo, ml = merge_attention_states([p[0] for p in parts], [p[2] for p in parts])
    assert parts[0][2][1].isinf().all() and not mo.isnan().any()
    assert rel_err(mo, one[0]) <= OUT_TOL[q.dtype]  # each shard's out is rounded to q's dtype before the merge
    keep = torch.arange(5, device=device) != 2
    assert rel_err(ml[keep], one[2][keep]) <= STAT_TOL
    assert torch.all(mo[2] == 0) and torch.all(ml[2] == -math.inf) and torch.all(one[2][2] == math.inf)


def test_fwd_noncontiguous_and_3d_indices(device):
    dt = _dtype(device)
    qb = torch.randn(5, 9, 600, device=device).to(dt)
    q = qb[:, 1:8:2, :576]            # strided heads and rows
    kvb = torch.randn(40, 3, 576, device=device).to(dt)
    kv = kvb[:, 1:2]                  # [s_kv, 1, d] with a row stride of 3 * 576
    idx = torch.randint(-2, 42, (5, 1, 45), dtype=torch.int32, device=device)
    got = sparse_mla(q, kv, idx, 0.06)
    ref = sparse_mla_fwd_ref(q, kv, idx[:, 0], 0.06)
    _check_fwd(got, ref, dt)


@pytest.mark.parametrize("k_stride,q_start", [(1, 11), (4, 9), (4, 0)])
def test_fwd_causal(device, k_stride, q_start):
    q, kv, idx = _inputs(device, 7, 30, 4, 26, lo=-1, hi=31)
    got, ref = _both(q, kv, idx, 0.09, q_start=q_start, k_stride=k_stride)
    _check_fwd(got, ref, q.dtype)
    if q_start == 0:  # rows 0..2 see no complete group of 4 raw tokens yet
        assert torch.all(got[2][:3] == float("inf")) and torch.all(got[0][:3] == 0)
    qt = torch.tensor([q_start], dtype=torch.int32, device=device)  # the device-tensor form gives the same
    got_t = sparse_mla(q, kv, idx, 0.09, q_start=qt, k_stride=k_stride)
    for a, b in zip(got, got_t):
        assert torch.equal(a, b)


def test_fwd_topk_length_and_sink(device):
    q, kv, idx = _inputs(device, 6, 45, 5, 37)
    tl = torch.tensor([0, 1, 20, 37, 100, -4], dtype=torch.int32, device=device)  # clamped to [0, topk]
    sink = torch.randn(5, device=device) * 2
    sink[0] = float("-inf")  # -inf: no effect
    sink[1] = float("inf")   # +inf: out 0, lse +inf
    got, ref = _both(q, kv, idx, 0.05, topk_length=tl, attn_sink=sink)
    _check_fwd(got, ref, q.dtype)
    assert torch.all(got[0][0] == 0) and torch.all(got[2][5] == float("inf"))
    assert torch.all(got[0][:, 1] == 0) and torch.all(got[2][:, 1] == float("inf"))


def test_fwd_writes_every_output(device):
    """Launcher with NaN-poisoned buffers: every element (empty rows too) must be written."""
    q, kv, idx = _inputs(device, 5, 20, 19, 21)  # 19 heads: two head blocks under the interpreter
    idx[4] = -1
    a = prepare(q, kv, idx, 0.1, attn_sink=torch.randn(19, device=device))
    out = torch.full((5, 19, 512), float("nan"), dtype=q.dtype, device=device)
    m = torch.full((5, 19), float("nan"), device=device)
    l = torch.full((5, 19), float("nan"), device=device)
    sparse_mla_fwd_launch(a, out, m, l, config=dict(BLOCK_H=16, BLOCK_N=16, num_warps=4, num_stages=1))
    assert not out.isnan().any() and not m.isnan().any() and not l.isnan().any()
    _check_fwd((out, m, l), sparse_mla_fwd_ref(q, kv, idx, 0.1, attn_sink=a.attn_sink), q.dtype)


def test_flash_mla_drop_in_semantics(device):
    """FlashMLA: the sink scales out by exp(lse) / (exp(lse) + exp(sink)); lse and max_logits ignore it."""
    q, kv, idx = _inputs(device, 4, 30, 6, 20)
    idx[0] = -1
    sink = torch.randn(6, device=device)
    o, m, l = flash_mla_sparse_fwd(q, kv, idx[:, None, :], 0.1, 512, sink)
    ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, 0.1)
    ro = ro * torch.sigmoid(rl - sink)[..., None]  # rl = +inf on the empty row: factor 1, ro = 0 there
    _check_fwd((o, m, l), (ro, rm, rl), q.dtype)
    o2, _, l2 = flash_mla_sparse_fwd(q, kv, idx[:, None, :], 0.1)
    o3, _, l3 = sparse_mla(q, kv, idx, 0.1)
    assert torch.equal(o2, o3) and torch.equal(l2, l3)  # without a sink both conventions agree


# --- attention distribution and KL loss: CPU -----------------------------------------------------

@pytest.mark.parametrize("h_q,d_qk", [(1, 576), (7, 512), (16, 576)])
def test_attn_dist_matches_reference(device, h_q, d_qk):
    q, kv, idx = _inputs(device, 6, 40, h_q, 45, d_qk)
    idx[0] = -1
    tl = torch.randint(0, 50, (6,), dtype=torch.int32, device=device)
    kw = dict(q_start=30, k_stride=2, topk_length=tl)
    _, _, lse = sparse_mla(q, kv, idx, 0.07, **kw)
    d = sparse_mla_attn_dist(q, kv, idx, lse, 0.07, **kw)
    rd = sparse_mla_attn_dist_ref(q, kv, idx, lse, 0.07, **kw)
    assert d.shape == idx.shape and d.dtype == torch.float32
    assert rel_err(d, rd) <= STAT_TOL  # fp32 logits of exact products: see spec.STAT_TOL
    valid = valid_mask(idx, 40, **kw)
    assert torch.all(d[~valid] == 0)  # exactly 0 at invalid entries
    # with the forward's lse (no sink), each row with a valid index sums to h_q (each head sums to 1)
    rows = valid.any(-1)
    torch.testing.assert_close(d.sum(-1)[rows], torch.full_like(d.sum(-1)[rows], h_q), rtol=1e-4, atol=0)


def test_attn_dist_head_shards_add_up_and_atomic_path(device):
    q, kv, idx = _inputs(device, 5, 30, 40, 33)
    _, _, lse = sparse_mla(q, kv, idx, 0.1)
    full = sparse_mla_attn_dist(q, kv, idx, lse, 0.1)
    shards = sum(sparse_mla_attn_dist(q[:, a:b], kv, idx, lse[:, a:b], 0.1) for a, b in [(0, 13), (13, 32), (32, 40)])
    assert rel_err(shards, full) <= 1e-5  # the same fp32 terms summed in another order
    # three head blocks of 16: partial sums added atomically into the zeroed output
    a = prepare(q, kv, idx, 0.1)
    out = torch.zeros(idx.shape, device=device)
    attn_dist_launch(a, lse, out, config=dict(BLOCK_H=16, BLOCK_N=16, num_warps=4, num_stages=1))
    assert rel_err(out, sparse_mla_attn_dist_ref(q, kv, idx, lse, 0.1)) <= STAT_TOL


def test_attn_dist_writes_every_entry(device):
    """One head block stores (not adds) every entry below topk_length: NaN-poison them all."""
    q, kv, idx = _inputs(device, 4, 25, 8, 30)
    _, _, lse = sparse_mla(q, kv, idx, 0.1)
    out = torch.full(idx.shape, float("nan"), device=device)
    attn_dist_launch(prepare(q, kv, idx, 0.1), lse, out)
    assert not out.isnan().any()
    assert rel_err(out, sparse_mla_attn_dist_ref(q, kv, idx, lse, 0.1)) <= STAT_TOL


@pytest.mark.parametrize("tlen", [False, True])
def test_indexer_kl_loss_and_grad(device, tlen):
    q, kv, idx = _inputs(device, 6, 35, 6, 29)
    idx[2] = -1  # contributes 0
    kw = dict(q_start=20, k_stride=1)
    if tlen:  # entries past topk_length are invalid for the loss as for the attention (strictly inside (0, topk))
        kw["topk_length"] = torch.tensor([5, 28, 9, 1, 17, 12], dtype=torch.int32, device=device)
    _, _, lse = sparse_mla(q, kv, idx, 0.1, **kw)
    logits = torch.randn(6, 29, device=device, requires_grad=True)
    loss = indexer_kl_loss(logits, q, kv, idx, lse, 0.1, **kw)
    logits_r = logits.detach().clone().requires_grad_()
    ref = indexer_kl_loss_ref(logits_r, q, kv, idx, lse, 0.1, **kw)
    g = torch.randn((), device=device)
    loss.backward(g)
    ref.backward(g)
    assert loss.shape == () and abs(loss.item() - ref.item()) <= 1e-4 * max(1.0, abs(ref.item()))
    assert rel_err(logits.grad, logits_r.grad) <= 1e-4  # closed form softmax - p vs autograd, fp32
    assert torch.all(logits.grad[2] == 0)
    # a row with no valid index adds nothing to the loss
    logits2 = logits.detach().clone()
    logits2[2] = torch.randn(29, device=device) * 10
    assert indexer_kl_loss(logits2, q, kv, idx, lse, 0.1, **kw).item() == pytest.approx(loss.item(), rel=1e-6)


def test_indexer_kl_loss_tensor_parallel(device):
    """Head shards: the all-reduced attn_dist passed as attn_dist gives the loss of all heads on every shard; a
    shard's own distribution alone would not."""
    q, kv, idx = _inputs(device, 5, 40, 6, 24)
    kw = dict(q_start=30, k_stride=1)
    _, _, lse = sparse_mla(q, kv, idx, 0.1, **kw)
    logits = torch.randn(5, 24, device=device)
    full = indexer_kl_loss(logits, q, kv, idx, lse, 0.1, **kw)
    shards = [(q[:, h:h + 3], lse[:, h:h + 3]) for h in (0, 3)]
    dist = sum(sparse_mla_attn_dist(qs, kv, idx, ls, 0.1, **kw) for qs, ls in shards)
    for qs, ls in shards:
        lg = logits.clone().requires_grad_()
        loss = indexer_kl_loss(lg, qs, kv, idx, ls, 0.1, attn_dist=dist, **kw)
        assert abs(loss.item() - full.item()) <= 1e-5 * max(1.0, abs(full.item()))  # fp32 sums in another order
        lg_r = logits.clone().requires_grad_()
        indexer_kl_loss_ref(lg_r, qs, kv, idx, ls, 0.1, attn_dist=dist, **kw).backward()
        loss.backward()
        assert rel_err(lg.grad, lg_r.grad) <= 1e-4
    # one shard's own p is not the full p: the gradients (softmax(logits) - p, per row) show it; the loss alone can
    # lie within 1e-3 of the full one (seen on the H100 with a random seed)
    lg_a, lg_f = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    indexer_kl_loss(lg_a, shards[0][0], kv, idx, shards[0][1], 0.1, **kw).backward()
    indexer_kl_loss(lg_f, q, kv, idx, lse, 0.1, **kw).backward()
    assert rel_err(lg_a.grad, lg_f.grad) > 1e-2
    with pytest.raises(TypeError, match="attn_dist"):
        indexer_kl_loss(logits, q, kv, idx, lse, 0.1, attn_dist=dist.half(), **kw)
    with pytest.raises(ValueError, match="attn_dist"):
        indexer_kl_loss(logits, q, kv, idx, lse, 0.1, attn_dist=dist[:, :5], **kw)
    negative = dist.clone()
    negative[1, 2] = -0.25  # not an attention mass: refused (it made the loss NaN)
    with pytest.raises(ValueError, match="attn_dist holds negative values"):
        indexer_kl_loss(logits, q, kv, idx, lse, 0.1, attn_dist=negative, **kw)


# --- torch.compile / custom-op plumbing: CPU ------------------------------------------------------

def test_torch_compile_fullgraph(device):
    q, kv, idx = _inputs(device, 3, 20, 4, 17)
    qs = torch.tensor([5], dtype=torch.int32, device=device)

    def f(q, kv, idx, logits):
        o, m, l = sparse_mla(q, kv, idx, 0.1, q_start=qs)
        d = sparse_mla_attn_dist(q, kv, idx, l, 0.1, q_start=qs)
        return o, d, indexer_kl_loss(logits, q, kv, idx, l, 0.1, q_start=qs)

    logits = torch.randn(3, 17, device=device)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    got = torch.compile(f, fullgraph=True, backend=backend)(q, kv, idx, logits)
    want = f(q, kv, idx, logits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # our kernels: the same launches
    # the loss is torch arithmetic around the op, which inductor fuses and reassociates: fp32 rounding only
    assert torch.isfinite(got[2]) and rel_err(got[2], want[2]) <= 1e-5


def test_opcheck(device):
    q, kv, idx = _inputs(device, 3, 20, 4, 17)
    a = prepare(q, kv, idx, 0.1, q_start=3, topk_length=torch.full((3,), 9, dtype=torch.int32, device=device))
    args = (a.q, a.kv, a.indices, a.sm_scale, a.d_v, a.attn_sink, a.topk_length, a.q_start_t, a.q_start_int,
            a.causal, a.k_stride)
    tests = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.llmkernels.sparse_mla_fwd.default, args, test_utils=tests)
    lse = sparse_mla(q, kv, idx, 0.1)[2]
    torch.library.opcheck(torch.ops.llmkernels.sparse_mla_attn_dist.default,
                          (a.q, a.kv, a.indices, lse, 0.1, None, None, 0, False, 1), test_utils=tests)


# --- bad inputs ----------------------------------------------------------------------------------

def test_huge_q_start(device):
    """A q_start past s_kv * k_stride bounds nothing: same result as q_start = s_kv (no int64 overflow, no torch
    "Expected a value of type 'int'" error from the custom op); a k_stride past int32 gets a clear error."""
    q, kv, idx = _inputs(device, 3, 20, 4, 17)
    for qs in (2 ** 63, 2 ** 63 - 1, 2 ** 40):
        for got, want in zip(sparse_mla(q, kv, idx, 0.1, q_start=qs), sparse_mla(q, kv, idx, 0.1, q_start=20)):
            assert torch.equal(got, want)
    out, _, lse = sparse_mla(q, kv, idx, 0.1)
    dq, dkv = sparse_mla_bwd(q, kv, out, torch.randn_like(out), idx, lse, 0.1, q_start=2 ** 63)
    assert dq.isfinite().all() and dkv.isfinite().all()
    with pytest.raises(ValueError, match="k_stride must be <="):
        sparse_mla(q, kv, idx, 0.1, q_start=3, k_stride=2 ** 63)


def test_bad_inputs(device):
    q, kv, idx = _inputs(device, 3, 20, 4, 17)
    lse = sparse_mla(q, kv, idx, 0.1)[2]
    cases = [
        (TypeError, "q must", lambda: sparse_mla(q.float(), kv, idx, 0.1)),
        (TypeError, "kv must", lambda: sparse_mla(q, kv.float(), idx, 0.1)),
        (ValueError, "d_qk", lambda: sparse_mla(q[..., :128], kv[..., :128], idx, 0.1)),
        (ValueError, "kv's last dim", lambda: sparse_mla(q, kv[..., :512], idx, 0.1)),
        (ValueError, "one latent head", lambda: sparse_mla(q, kv.expand(20, 2, 576), idx, 0.1)),
        (TypeError, "indices must", lambda: sparse_mla(q, kv, idx.long(), 0.1)),
        (ValueError, "s_q=3 rows", lambda: sparse_mla(q, kv, idx[:2], 0.1)),
        (ValueError, "topk >= 1", lambda: sparse_mla(q, kv, idx[:, :0], 0.1)),
        (TypeError, "sm_scale is required", lambda: sparse_mla(q, kv, idx, None)),
        (ValueError, "sm_scale must be finite", lambda: sparse_mla(q, kv, idx, float("nan"))),
        (ValueError, "d_v must be 512", lambda: sparse_mla(q, kv, idx, 0.1, d_v=256)),
        (ValueError, "k_stride must be >= 1", lambda: sparse_mla(q, kv, idx, 0.1, q_start=0, k_stride=-1)),
        (ValueError, "k_stride must be >= 1", lambda: sparse_mla(q, kv, idx, 0.1, k_stride=0)),
        (ValueError, "q_start must be >= 0", lambda: sparse_mla(q, kv, idx, 0.1, q_start=-1)),
        (TypeError, "q_start must", lambda: sparse_mla(q, kv, idx, 0.1, q_start=torch.tensor([1]))),
        (ValueError, "attn_sink must be", lambda: sparse_mla(q, kv, idx, 0.1, attn_sink=torch.zeros(5))),
        (TypeError, "attn_sink must", lambda: sparse_mla(q, kv, idx, 0.1, attn_sink=torch.zeros(4).half())),
        (TypeError, "topk_length must", lambda: sparse_mla(q, kv, idx, 0.1, topk_length=torch.zeros(3))),
        (ValueError, "topk_length must be", lambda: sparse_mla(q, kv, idx, 0.1,
                                                                 topk_length=torch.zeros(4, dtype=torch.int32))),
        (ValueError, "unit stride", lambda: sparse_mla(q.transpose(0, 2).contiguous().transpose(0, 2), kv, idx, 0.1)),
        (ValueError, "lse must have shape", lambda: sparse_mla_attn_dist(q, kv, idx, lse[:, :2], 0.1)),
        (TypeError, "lse must", lambda: sparse_mla_attn_dist(q, kv, idx, lse.double(), 0.1)),
        (ValueError, "k_stride must be >= 1", lambda: sparse_mla_attn_dist(q, kv, idx, lse, 0.1, 0, -2)),
        (ValueError, "index_logits must have shape",
         lambda: indexer_kl_loss(torch.zeros(3, 16), q, kv, idx, lse, 0.1)),
        (ValueError, "lse must have shape", lambda: indexer_kl_loss(torch.zeros(3, 17), q, kv, idx, lse[:1], 0.1)),
    ]
    for exc, msg, fn in cases:
        with pytest.raises(exc, match=msg):
            fn()


def test_tail_split_plan():
    from llmkernels.ops.sparse_mla.fwd_wgmma import tail_split  # (whole items, pieces per item, pairs per piece)
    assert tail_split(4096, 132, 16) == (4092, 16, 1)  # s_q 4096, h_q 64: 31 full waves + 4 items in 16 pieces
    assert tail_split(8192, 132, 16) == (8184, 16, 1)
    assert tail_split(24, 132, 16) == (0, 4, 4)  # fewer items than SMs: every item split (5 a SM -> 4 pieces of 4)
    assert tail_split(264, 132, 16) == (264, 1, 16)  # full waves only
    assert tail_split(200, 132, 16) == (200, 1, 16)  # 68 items in the last wave: not two pieces each
    assert tail_split(8, 132, 1) == (8, 1, 1)  # one pair: nothing to split
    # the merge (a launch, the parts written and read) must cost less than the pairs saved
    assert tail_split(64, 132, 2) == (64, 1, 2)  # s_q 64, h_q 64, topk 256: 21.4 us split, 12.7 whole
    assert tail_split(64, 132, 4) == (64, 1, 4)  # topk 512: 24.9 / 19.7
    assert tail_split(64, 132, 16) == (0, 2, 8)  # topk 2048: 44.6 / 59.0
    assert tail_split(16, 132, 2) == (16, 1, 2)  # s_q 16: 12.0 / 11.3


def test_tail_merge_matches_reference(device):
    """fwd_wgmma._tail_merge (the merge of the split last wave) on pieces that the reference computes on slices of
    the indices equals the reference on all of them: with a sink, an empty piece and a row with nothing valid."""
    from llmkernels.ops.sparse_mla.fwd_wgmma import _tail_merge
    s_q, s_kv, h_q, topk, scale = 3, 50, 70, 40, 0.06
    q, kv, idx = _inputs(device, s_q, s_kv, h_q, topk, lo=0, hi=s_kv)
    q, kv = q.float(), kv.float()
    idx[1, 15:30] = -1  # row 1: its second piece has nothing valid
    idx[2] = -1  # row 2: nothing valid at all
    sink = torch.randn(h_q, device=device)
    cuts = [(0, 15), (15, 30), (30, topk)]
    n_hb, item0, n_tail, n_piece = 2, 2, 4, len(cuts)  # items 2..5: rows 1 and 2, two head blocks each
    part = torch.full((n_tail * n_piece, 64 * 512 + 128), float("nan"), device=device)
    for p, (a, b) in enumerate(cuts):
        sub = torch.full_like(idx, -1)
        sub[:, a:b] = idx[:, a:b]
        o, m, lse = sparse_mla_fwd_ref(q, kv, sub, scale)  # O / l of the piece, its max and lse, no sink
        lse2 = torch.where(torch.isinf(lse), float("-inf"), lse * 1.4426950408889634)
        for j in range(n_tail):
            row, hb = divmod(item0 + j, n_hb)
            heads = slice(hb * 64, min(hb * 64 + 64, h_q))
            n = heads.stop - heads.start
            blk = part[j * n_piece + p]
            blk[:n * 512] = o[row, heads].reshape(-1)  # rows past h_q stay NaN: the merge must not read them
            blk[64 * 512:64 * 512 + n] = lse2[row, heads]
            blk[64 * 512 + 64:64 * 512 + 64 + n] = m[row, heads] * 1.4426950408889634
    out = torch.full((s_q, h_q, 512), float("nan"), device=device)
    maxl = torch.full((s_q, h_q), float("nan"), device=device)
    lse = torch.full((s_q, h_q), float("nan"), device=device)
    _tail_merge[(n_tail, 64)](part, out, maxl, lse, sink, item0, n_piece, n_hb, h_q, out.stride(0), out.stride(1),
                              lse.stride(0), HAS_SINK=True, SINK_IN_LSE=True, BLOCK_P=4, D_V=512)
    ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, scale, attn_sink=sink)
    # fp32 throughout: only the order of the sums differs
    assert rel_err(out[1:], ro[1:]) < 1e-5, rel_err(out[1:], ro[1:])
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert rel_err(maxl[1:], rm[1:]) < 1e-6 and rel_err(lse[1:], rl[1:]) < 1e-6
    assert torch.isinf(lse[2]).all() and (lse[2] > 0).all() and torch.isneginf(maxl[2]).all()


# --- GPU ------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("h_q", [1, 16, 64, 128])  # the Gluon forward pads every h_q to 64-head blocks
def test_gpu_gluon_kernels_match_triton(h_q):
    """On sm_90 the public ops run the Gluon kernels: they must agree with the Triton kernels (forced by config)."""
    from llmkernels.ops.sparse_mla.attn_dist import dist_config
    from llmkernels.ops.sparse_mla.wgmma_common import wgmma_usable
    from llmkernels.ops.sparse_mla.fwd import fwd_config
    dev = torch.device("cuda")
    q = torch.randn(41, h_q, 576, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(900, 1, 576, device=dev, dtype=torch.bfloat16)
    idx = causal_indices(41, 900, 300, 859, dev)
    idx[3, :5] = torch.tensor([-1, 900, I32_MIN, I32_MAX, 0], dtype=torch.int32, device=dev)
    a = prepare(q, kv, idx, 0.04, q_start=859)
    if torch.cuda.get_device_capability() == (9, 0):
        assert wgmma_usable(a)  # so this test does exercise the Gluon kernels
    outs = []
    for cfg in (None, fwd_config(h_q, 300, dev)):
        o = (torch.full((41, h_q, 512), float("nan"), device=dev, dtype=torch.bfloat16),
             torch.full((41, h_q), float("nan"), device=dev), torch.full((41, h_q), float("nan"), device=dev))
        sparse_mla_fwd_launch(a, *o, config=cfg)
        d = torch.zeros(41, 300, device=dev)
        attn_dist_launch(a, o[2], d, config=None if cfg is None else dist_config(h_q, 300, dev))
        outs.append((*o, d))
    (o1, m1, l1, d1), (o2, m2, l2, d2) = outs
    assert rel_err(o1, o2) <= OUT_TOL[torch.bfloat16]  # P is rounded to bf16 in both, summation orders differ
    assert rel_err(m1, m2) <= STAT_TOL and rel_err(l1, l2) <= STAT_TOL and rel_err(d1, d2) <= STAT_TOL


@gpu
@pytest.mark.parametrize("h_q", [1, 8, 16, 64, 96, 128, 200])  # sm_90: 96 / 200 pad the Gluon kernels' head blocks
@pytest.mark.parametrize("d_qk", [576, 512])
def test_gpu_fwd_and_dist_causal(h_q, d_qk):
    dev = torch.device("cuda")
    s_q, s_kv, topk = 97, 1500, 700  # topk not a multiple of 64
    q = torch.randn(s_q, h_q, d_qk, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, device=dev, dtype=torch.bfloat16)
    for k_stride in (1, 4):
        q_start = s_kv * k_stride - s_q - 50
        idx = causal_indices(s_q, s_kv, topk, q_start, dev, k_stride=k_stride)
        idx[:, ::7] = torch.randint(s_kv // 2, s_kv, idx[:, ::7].shape, device=dev, dtype=torch.int32)  # some future
        idx[5, 3:9] = torch.tensor([-1, s_kv, I32_MIN, I32_MAX, 7, 7], dtype=torch.int32, device=dev)
        idx[6] = -1
        sink = torch.randn(h_q, device=dev)
        tl = torch.randint(0, topk + 10, (s_q,), dtype=torch.int32, device=dev)
        kw = dict(q_start=q_start, k_stride=k_stride, topk_length=tl)
        got, ref = _both(q, kv, idx, d_qk ** -0.5, attn_sink=sink, **kw)
        _check_fwd(got, ref, torch.bfloat16)
        d = sparse_mla_attn_dist(q, kv, idx, got[2], d_qk ** -0.5, **kw)
        rd = sparse_mla_attn_dist_ref(q, kv, idx, got[2], d_qk ** -0.5, **kw)
        assert rel_err(d, rd) <= STAT_TOL
        assert torch.all(d[~valid_mask(idx, s_kv, **kw)] == 0)


@gpu
@pytest.mark.parametrize("h_q", [1, 16, 64])
@pytest.mark.parametrize("d_qk", [576, 512])
def test_gpu_attn_dist_row_pairs(h_q, d_qk):
    """sm_90, h_q <= 64: programs over pairs of rows (the public op uses them only past one row per SM, so force
    them): rows of a pair with different topk_length (different tile counts), an odd s_q, garbage and future
    indices, k_stride 4. Equal to the reference, and bit for bit to one row per program."""
    from llmkernels.ops.sparse_mla.attn_dist_wgmma import attn_dist_ws_launch
    from llmkernels.ops.sparse_mla.wgmma_common import wgmma_usable
    dev = torch.device("cuda")
    s_q, s_kv, topk = 97, 1500, 700
    q = torch.randn(s_q, h_q, d_qk, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, device=dev, dtype=torch.bfloat16)
    q_start = s_kv * 4 - s_q - 50
    idx = causal_indices(s_q, s_kv, topk, q_start, dev, k_stride=4)
    idx[:, ::7] = torch.randint(s_kv // 2, s_kv, idx[:, ::7].shape, device=dev, dtype=torch.int32)
    idx[5, 3:9] = torch.tensor([-1, s_kv, I32_MIN, I32_MAX, 7, 7], dtype=torch.int32, device=dev)
    idx[6] = -1
    tl = torch.randint(0, topk + 10, (s_q,), dtype=torch.int32, device=dev)
    kw = dict(q_start=q_start, k_stride=4, topk_length=tl)
    a = prepare(q, kv, idx, d_qk ** -0.5, **kw)
    if torch.cuda.get_device_capability() != (9, 0) or not wgmma_usable(a):
        pytest.skip("the Gluon attn_dist runs on sm_90 only")
    lse = sparse_mla(q, kv, idx, d_qk ** -0.5, **kw)[2]
    ref = sparse_mla_attn_dist_ref(q, kv, idx, lse, d_qk ** -0.5, **kw)
    outs = []
    for cfg in (dict(PAIR=0), dict(SINGLES=0), dict(SINGLES=4)):  # 48 pairs + 1 single; 46 pairs + 5 singles
        d = torch.zeros(s_q, topk, device=dev)
        attn_dist_ws_launch(a, lse, d, config=cfg)
        assert rel_err(d, ref) <= STAT_TOL
        assert torch.all(d[~valid_mask(idx, s_kv, **kw)] == 0)
        outs.append(d)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@gpu
@pytest.mark.parametrize("h_q", [16, 128])
def test_gpu_fwd_and_dist_fp16(h_q):
    """fp16 inputs through the sm_90 kernels (their P conversion has an fp16 branch), with sinks and garbage."""
    dev = torch.device("cuda")
    s_q, s_kv, topk = 45, 900, 256
    q = torch.randn(s_q, h_q, 576, device=dev, dtype=torch.float16)
    kv = torch.randn(s_kv, 1, 576, device=dev, dtype=torch.float16)
    idx = causal_indices(s_q, s_kv, topk, s_kv - s_q, dev)
    idx[2, :4] = torch.tensor([-1, s_kv, I32_MIN, I32_MAX], dtype=torch.int32, device=dev)
    idx[3] = -1
    kw = dict(q_start=s_kv - s_q, attn_sink=torch.randn(h_q, device=dev))
    got, ref = _both(q, kv, idx, 576 ** -0.5, **kw)
    _check_fwd(got, ref, torch.float16)
    kw.pop("attn_sink")
    d = sparse_mla_attn_dist(q, kv, idx, got[2], 576 ** -0.5, **kw)
    assert rel_err(d, sparse_mla_attn_dist_ref(q, kv, idx, got[2], 576 ** -0.5, **kw)) <= STAT_TOL


@gpu
def test_gpu_kl_loss_many_heads_and_determinism():
    dev = torch.device("cuda")
    q = torch.randn(64, 200, 576, device=dev, dtype=torch.bfloat16)  # 200 heads: two blocks, atomics
    kv = torch.randn(900, 1, 576, device=dev, dtype=torch.bfloat16)
    idx = causal_indices(64, 900, 300, 836, dev)
    _, _, lse = sparse_mla(q, kv, idx, 0.04, q_start=836)
    d1 = sparse_mla_attn_dist(q, kv, idx, lse, 0.04, q_start=836)
    d2 = sparse_mla_attn_dist(q, kv, idx, lse, 0.04, q_start=836)
    assert torch.equal(d1, d2)  # 0 + a + b is the same in either order
    logits = torch.randn(64, 300, device=dev, requires_grad=True)
    loss = indexer_kl_loss(logits, q, kv, idx, lse, 0.04, q_start=836)
    lr = logits.detach().clone().requires_grad_()
    ref = indexer_kl_loss_ref(lr, q, kv, idx, lse, 0.04, q_start=836)
    loss.backward()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-4 * abs(ref.item())
    assert rel_err(logits.grad, lr.grad) <= 1e-4


@gpu
def test_gpu_large_kv_offsets():
    """kv row offsets beyond 2^31 elements: the gather address math must be 64-bit."""
    dev = torch.device("cuda")
    s_kv = (1 << 31) // 576 + 5000
    kv = torch.empty(s_kv, 1, 576, device=dev, dtype=torch.bfloat16).normal_()
    q = torch.randn(4, 16, 576, device=dev, dtype=torch.bfloat16)
    idx = torch.randint(s_kv - 10000, s_kv, (4, 100), device=dev, dtype=torch.int32)
    got = sparse_mla(q, kv, idx, 0.05)
    ref = sparse_mla_fwd_ref(q, kv, idx, 0.05)
    _check_fwd(got, ref, torch.bfloat16)
    del kv
    torch.cuda.empty_cache()


@gpu
def test_gpu_cuda_graph_and_compile():
    dev = torch.device("cuda")
    q = torch.randn(33, 64, 576, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(500, 1, 576, device=dev, dtype=torch.bfloat16)
    idx = causal_indices(33, 500, 256, 467, dev)
    qs = torch.tensor([467], dtype=torch.int32, device=dev)
    want = sparse_mla(q, kv, idx, 0.05, q_start=qs)
    want_d = sparse_mla_attn_dist(q, kv, idx, want[2], 0.05, q_start=qs)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_mla(q, kv, idx, 0.05, q_start=qs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = sparse_mla(q, kv, idx, 0.05, q_start=qs)
        got_d = sparse_mla_attn_dist(q, kv, idx, got[2], 0.05, q_start=qs)
    qs.fill_(400)  # the graph reads q_start on the device at replay
    g.replay()
    torch.cuda.synchronize()
    ref = sparse_mla_fwd_ref(q, kv, idx, 0.05, q_start=400)
    _check_fwd(got, ref, torch.bfloat16)
    qs.fill_(467)
    g.replay()
    for a, b in zip(got + (got_d,), want + (want_d,)):
        assert torch.equal(a, b)
    comp = torch.compile(lambda q, kv, idx: sparse_mla(q, kv, idx, 0.05, q_start=qs), fullgraph=True)
    for a, b in zip(comp(q, kv, idx), want):
        assert torch.equal(a, b)


@gpu
def test_gpu_against_flash_mla_if_installed():
    fm = pytest.importorskip("flash_mla", reason="flash_mla is not installed")
    dev = torch.device("cuda")
    q = torch.randn(128, 128, 576, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(4096, 1, 576, device=dev, dtype=torch.bfloat16)
    idx = causal_indices(128, 4096, 2048, 3968, dev)[:, None, :]
    sink = torch.randn(128, device=dev)
    # the sgl-flash-mla wheel runs its sm_90 kernel only with use_legacy=True
    a = fm.flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink, use_legacy=torch.cuda.get_device_capability(dev)[0] == 9)
    b = flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink)
    assert rel_err(b[0], a[0]) <= 1.2e-2 and rel_err(b[2], a[2]) <= STAT_TOL
