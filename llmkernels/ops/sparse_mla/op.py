"""Sparse MLA (DeepSeek-V3.2): forward, FlashMLA drop-in, attention distribution and the indexer KL loss."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..._launch import current_device, keep_plan, kept_plan, new_token, run_planned, tkey, tracing, zero_async
from ..._runtime import capturing
from ..._validate import check_same_device, check_shape, check_tensor
from .attn_dist import attn_dist_launch
from .common import Checked, SparseArgs, bare, call_key, prepare, rebind, rebind_is_view
from .fwd import sparse_mla_fwd_launch
from .attn_dist_wgmma import DistWsPlan
from .fwd_wgmma import FwdWsPlan
from .wgmma_common import wgmma_usable


def _args(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal, k_stride):
    return SparseArgs(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, causal, q_start_int, q_start_t, k_stride)


def _fwd_outputs(q, d_v):
    s_q, h_q = q.shape[:2]
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


def _fwd(a: SparseArgs, sink_in_lse: bool, plan=None):
    out, max_logits, lse = _fwd_outputs(a.q, a.d_v)
    if plan is not None:
        plan(a, out, max_logits, lse)
    else:
        sparse_mla_fwd_launch(a, out, max_logits, lse, sink_in_lse=sink_in_lse)
    return out, max_logits, lse


def _fwd_plan(a: SparseArgs, sink_in_lse: bool):
    """A kept plan where the forward takes the Gluon kernels (else None: run_planned's keyed launches)."""
    if a.q.shape[0] == 0 or a.q.shape[1] == 0 or not wgmma_usable(a):
        return None
    out, _, lse = _fwd_outputs(a.q, a.d_v)  # strides only: the outputs of every call are allocated alike
    return FwdWsPlan(a, out, lse, sink_in_lse)


def _dist(a: SparseArgs, lse, plan=None):
    out = torch.zeros(a.indices.shape, dtype=torch.float32, device=a.q.device)  # the kernel adds into it
    if plan is not None:
        plan(a, lse, out)
    else:
        attn_dist_launch(a, lse, out)
    return out


def _dist_plan(a: SparseArgs, lse):
    """A kept plan where attn_dist takes the Gluon kernels (attn_dist_launch's choice), else None."""
    if a.q.shape[0] == 0 or a.q.shape[1] == 0 or a.q.shape[1] > 128 or not wgmma_usable(a):
        return None
    return DistWsPlan(a, lse, torch.empty(a.indices.shape, dtype=torch.float32, device=a.q.device))


# a checked call's key -> its common.Checked, where that call ran directly
_SITE_OF = {"fwd": "sparse_mla", "flash": "flash_mla_sparse_fwd", "dist": "sparse_mla_attn_dist"}


def _tensors(raw, extra_tensors):
    q, kv, indices, _, _, attn_sink, topk_length, q_start, _ = raw
    return q, kv, indices, attn_sink, topk_length, *extra_tensors, q_start if isinstance(q_start, Tensor) else None


def _lookup(kind, raw, extra_tensors=()):
    """(key, hit): hit = the common.Checked a direct call recorded for the key, where this call may run directly
    too, else None; the key is None while tracing."""
    key = None if tracing() else (_SITE_OF[kind], current_device(), *call_key(*raw), *map(tkey, extra_tensors))
    return key, kept_plan(key, _tensors(raw, extra_tensors))


def _rebind(hit, raw):
    q, kv, indices, _, _, attn_sink, topk_length, q_start, _ = raw
    return rebind(hit.args, q, kv, indices, attn_sink, topk_length, q_start)


def _direct(kind, key, a, raw, extra_tensors=(), plan=None):
    """After the checks: the hit (see _lookup) recorded for a call that runs directly, or None: the custom op.
    plan: a function of the canonical arguments making the kept plan (or None)."""
    return keep_plan(key, lambda: Checked(bare(a), new_token(), plan(a) if plan is not None else None,
                                          rebind_is_view(raw[5], raw[6])), _tensors(raw, extra_tensors))


def _fwd_raw(plan, raw):
    """A kept forward plan on the caller's tensors (FwdWsPlan.direct): no canonical arguments built."""
    q, kv, indices, _, _, attn_sink, topk_length, q_start, _ = raw
    out, max_logits, lse = _fwd_outputs(q, 512)
    plan.run(q, kv, indices, attn_sink, topk_length, q_start if isinstance(q_start, Tensor) else None, out,
             max_logits, lse)
    return out, max_logits, lse


@torch.library.custom_op("llmkernels::sparse_mla_fwd", mutates_args=())
def sparse_mla_fwd_op(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int,
                      attn_sink: Optional[Tensor], topk_length: Optional[Tensor], q_start_t: Optional[Tensor],
                      q_start_int: int, causal: bool, k_stride: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Canonical forms from common.prepare: q [s_q,h_q,d_qk], kv [s_kv,d_qk], indices [s_q,topk] int32."""
    return _fwd(_args(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal,
                      k_stride), True)


@sparse_mla_fwd_op.register_fake
def _(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal, k_stride):
    return _fwd_outputs(q, d_v)


@torch.library.custom_op("llmkernels::flash_mla_sparse_fwd", mutates_args=())
def _flash_mla_op(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int,
                  attn_sink: Optional[Tensor], topk_length: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    return _fwd(_args(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, None, 0, False, 1), False)


@_flash_mla_op.register_fake
def _(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    return _fwd_outputs(q, d_v)


@torch.library.custom_op("llmkernels::sparse_mla_attn_dist", mutates_args=())
def sparse_mla_attn_dist_op(q: Tensor, kv: Tensor, indices: Tensor, lse: Tensor, sm_scale: float,
                            topk_length: Optional[Tensor], q_start_t: Optional[Tensor], q_start_int: int,
                            causal: bool, k_stride: int) -> Tensor:
    return _dist(_args(q, kv, indices, sm_scale, 512, None, topk_length, q_start_t, q_start_int, causal, k_stride),
                 lse)


@sparse_mla_attn_dist_op.register_fake
def _(q, kv, indices, lse, sm_scale, topk_length, q_start_t, q_start_int, causal, k_stride):
    return indices.new_empty(indices.shape, dtype=torch.float32)


IntOrTensor = Union[None, int, Tensor]


def sparse_mla(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = 512,
               attn_sink: Optional[Tensor] = None, topk_length: Optional[Tensor] = None,
               q_start: IntOrTensor = None, k_stride: int = 1) -> Tuple[Tensor, Tensor, Tensor]:
    """Sparse MLA attention: every query row attends to the kv rows its indices list (one latent head).

    Args:
        q: [s_q, h_q, d_qk] bf16 (fp16 also runs), any h_q >= 1, d_qk in {576, 512}, unit last stride.
        kv: [s_kv, 1, d_qk] or [s_kv, d_qk], q's dtype, unit last stride. V is kv[..., :d_v].
        indices: [s_q, topk] or [s_q, 1, topk] int32, any topk >= 1. Entry t of row i is attended iff
            0 <= t < s_kv (every other int32 value means "no token" and is never read), and, with
            ``q_start``, t <= (q_start + i + 1 - k_stride) // k_stride, and, with ``topk_length``, its
            position j < topk_length[i]. Duplicates count once per listing.
        sm_scale: logit scale (required). d_v: 512.
        attn_sink: optional [h_q] fp32: exp(attn_sink[h]) joins the softmax denominator (no value).
        topk_length: optional [s_q] int32; values are clamped to [0, topk].
        q_start: None (no causal bound), an int >= 0 or a one-element int32 tensor (read on the device):
            absolute position of query row 0. k_stride: >= 1 raw tokens summarised by each kv entry.
    Returns:
        (out [s_q, h_q, 512] in q's dtype, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32): natural-log
        units; lse includes the sink (so exp(logit - lse) is the attention weight). A row with no valid
        index gets out = 0, max_logits = -inf and lse = +inf (so exp(s - lse) = 0 downstream).
    Batches: concatenate the sequences' tokens (q rows, kv rows), add each sequence's kv offset to its
    valid indices, and express causality in the indices (-1) when sequences start at different positions.
    """
    raw = (q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride)
    return _forward("fwd", raw, True)


def _forward(kind, raw, sink_in_lse):
    key, hit = _lookup(kind, raw)
    if hit is not None:
        if hit.raw_plan() is not None:
            return _fwd_raw(hit.plan, raw)
        return run_planned(hit.token, _fwd, _rebind(hit, raw), sink_in_lse, hit.plan)
    a = prepare(*raw)
    # inference: the custom op would only run _fwd (autograd needs the op)
    hit = _direct(kind, key, a, raw, plan=lambda a: _fwd_plan(a, sink_in_lse))
    if hit is not None:
        return run_planned(hit.token, _fwd, a, sink_in_lse, hit.plan)
    if kind == "flash":
        return _flash_mla_op(a.q, a.kv, a.indices, a.sm_scale, a.d_v, a.attn_sink, a.topk_length)
    return sparse_mla_fwd_op(a.q, a.kv, a.indices, a.sm_scale, a.d_v, a.attn_sink, a.topk_length,
                             a.q_start_t, a.q_start_int, a.causal, a.k_stride)


def flash_mla_sparse_fwd(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: Optional[Tensor] = None,
                         topk_length: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Drop-in for FlashMLA's ``flash_mla_sparse_fwd`` (same arguments and returns), for any h_q and topk.

    As in FlashMLA, the sink scales the output by exp(lse) / (exp(lse) + exp(attn_sink)) but is left out
    of the returned lse and max_logits (natural log; +inf / -inf for rows with no valid index).
    No autograd: use :func:`sparse_mla` for training.
    """
    return _forward("flash", (q, kv, indices, sm_scale, d_v, attn_sink, topk_length, None, 1), False)


def _check_lse(lse, q):
    check_tensor("lse", lse, dtypes=(torch.float32,), ndim=2)
    check_shape("lse", lse, q.shape[:2], "[s_q, h_q], from sparse_mla")
    check_same_device(q=q, lse=lse)


def sparse_mla_attn_dist(q: Tensor, kv: Tensor, indices: Tensor, lse: Tensor, sm_scale: float,
                         q_start: IntOrTensor = None, k_stride: int = 1,
                         topk_length: Optional[Tensor] = None) -> Tensor:
    """[s_q, topk] fp32: sum over heads h of exp(q_h . kv_t * sm_scale - lse_h) at valid t, exactly 0 elsewhere.

    Validity is as in :func:`sparse_mla`; lse [s_q, h_q] fp32 is the one sparse_mla returned (+inf rows
    give 0). Nothing of size [s_q, h_q, topk] is built. Over a shard of heads (tensor parallelism) it
    returns that shard's partial sum: summing the shards' results (all-reduce) gives the full distribution.
    """
    raw = (q, kv, indices, sm_scale, 512, None, topk_length, q_start, k_stride)
    key, hit = _lookup("dist", raw, (lse,))
    if hit is not None:
        if hit.raw_plan() is not None:
            out = torch.empty(indices.shape[0], indices.shape[-1], dtype=torch.float32, device=q.device)
            zero_async(out.data_ptr(), 4 * out.numel(), q.device.index)  # (the kernel adds into it)
            hit.plan.run(q, kv, indices, topk_length, q_start if isinstance(q_start, Tensor) else None, lse, out)
            return out
        return run_planned(hit.token, _dist, _rebind(hit, raw), lse, hit.plan)
    a = prepare(*raw)
    _check_lse(lse, a.q)
    hit = _direct("dist", key, a, raw, (lse,), plan=lambda a: _dist_plan(a, lse))
    if hit is not None:
        return run_planned(hit.token, _dist, a, lse, hit.plan)
    return sparse_mla_attn_dist_op(a.q, a.kv, a.indices, lse, a.sm_scale, a.topk_length, a.q_start_t,
                                   a.q_start_int, a.causal, a.k_stride)


def _valid_mask(a: SparseArgs) -> Tensor:
    """bool [s_q, topk], on the device and without host syncs (torch.compile-friendly)."""
    idx = a.indices
    s_q, topk = idx.shape
    ok = (idx >= 0) & (idx < a.kv.shape[0])
    if a.causal:
        qs = a.q_start_t.long() if a.q_start_t is not None else a.q_start_int
        rows = torch.arange(s_q, device=idx.device) + qs
        ok &= idx <= torch.div(rows + 1 - a.k_stride, a.k_stride, rounding_mode="floor")[:, None]
    if a.topk_length is not None:
        ok &= torch.arange(topk, device=idx.device)[None, :] < a.topk_length[:, None]
    return ok


class _KLLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, index_logits, p, valid):
        logits = index_logits.float().masked_fill(~valid, float("-inf"))
        # rows with no valid index (or no mass) contribute 0; "!= 0" rather than "> 0" keeps a NaN p NaN
        has = p.sum(dim=-1, keepdim=True) != 0
        logq = torch.log_softmax(torch.where(has, logits, torch.zeros_like(logits)), dim=-1)
        pos = p != 0
        terms = torch.where(pos, p * (torch.log(torch.where(pos, p, torch.ones_like(p))) - logq), torch.zeros_like(p))
        ctx.save_for_backward(torch.where(has, logq.exp(), torch.zeros_like(logq)), p)
        ctx.dtype = index_logits.dtype
        return terms.sum()

    @staticmethod
    def backward(ctx, g):
        softmax, p = ctx.saved_tensors
        return ((softmax - p) * g).to(ctx.dtype), None, None  # d KL(p || softmax(l)) / dl = softmax - p


def indexer_kl_loss(index_logits: Tensor, q: Tensor, kv: Tensor, indices: Tensor, lse: Tensor, sm_scale: float,
                    q_start: IntOrTensor = None, k_stride: int = 1, topk_length: Optional[Tensor] = None,
                    attn_dist: Optional[Tensor] = None) -> Tensor:
    """Sum over rows of KL(p || softmax(index_logits over the valid entries)), a 0-dim fp32 tensor.

    p is the row's attention distribution (:func:`sparse_mla_attn_dist`) L1-normalised; rows with no valid
    index contribute 0. Differentiable w.r.t. index_logits [s_q, topk] (fp32/bf16/fp16) only; the
    attention side is a constant target.

    attn_dist: optional fp32 [s_q, topk] distribution to use instead of computing it from q's heads. Under tensor
    parallelism (q and lse hold a shard of the heads) pass the all-reduced sum of the shards'
    :func:`sparse_mla_attn_dist`: computed from one shard, p would be that shard's distribution alone. Attention
    masses are >= 0: a negative entry raises ValueError (a host check, skipped under torch.compile and CUDA-graph
    capture; NaN entries pass and make the loss NaN).
    """
    a = prepare(q, kv, indices, sm_scale, 512, None, topk_length, q_start, k_stride)
    _check_lse(lse, a.q)
    check_tensor("index_logits", index_logits, dtypes=(torch.float32, torch.bfloat16, torch.float16))
    if index_logits.dim() == 3 and index_logits.shape[1] == 1:
        index_logits = index_logits[:, 0]
    check_shape("index_logits", index_logits, a.indices.shape, "[s_q, topk], like indices")
    if attn_dist is not None:
        check_tensor("attn_dist", attn_dist, dtypes=(torch.float32,))
        check_shape("attn_dist", attn_dist, a.indices.shape, "[s_q, topk], like indices")
    check_same_device(q=a.q, index_logits=index_logits, attn_dist=attn_dist)
    if attn_dist is not None and not tracing() and not capturing(attn_dist.device) and bool((attn_dist < 0).any()):
        raise ValueError("attn_dist holds negative values; it must be attention masses (>= 0), e.g. the sum of "
                         "sparse_mla_attn_dist over head shards")
    with torch.no_grad():
        if attn_dist is not None:
            dist = attn_dist.detach()
        else:
            dist = sparse_mla_attn_dist_op(a.q.detach(), a.kv.detach(), a.indices, lse.detach(), a.sm_scale,
                                           a.topk_length, a.q_start_t, a.q_start_int, a.causal, a.k_stride)
        mass = dist.sum(dim=-1, keepdim=True)
        p = dist / torch.where(mass == 0, torch.ones_like(mass), mass)
        valid = _valid_mask(a)
    return _KLLoss.apply(index_logits, p, valid)
