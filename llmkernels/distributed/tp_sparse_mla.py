"""Tensor-parallel sparse MLA: the query heads split over the ranks of a process group, kv (the one latent head),
indices and the indexer replicated. Each rank computes its heads; the head sums (attn_dist, kv's gradient) are
all-reduced, so every rank ends with what one GPU computes for its heads, plus the full loss and dkv (up to the
order of fp32 additions)."""
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..ops.sparse_mla.autograd import sparse_mla_bwd, sparse_mla_bwd_op
from ..ops.sparse_mla.common import prepare
from ..ops.sparse_mla.op import indexer_kl_loss, sparse_mla_attn_dist, sparse_mla_fwd_op
from ._comm import checked_plan, dtype_code, dtype_name, float_bits, require_equal, resolve_group

IntOrTensor = Union[None, int, Tensor]


def _checked(op, group, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride, validate):
    """prepare() on this rank, and once per shapes the cross-rank check: everything but h_q must match."""
    group, rank, world = resolve_group(group)
    box = {}

    def local_check():
        box["a"] = prepare(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride)

    def shape(t, i):
        return t.shape[i] if isinstance(t, Tensor) and t.dim() > i else -1

    qs = -1 if q_start is None else -2 if isinstance(q_start, Tensor) else \
        q_start if isinstance(q_start, int) and not isinstance(q_start, bool) else -3  # -3: prepare() will refuse it
    sc = sm_scale if isinstance(sm_scale, (int, float)) and not isinstance(sm_scale, bool) else 0.0
    meta = [0, shape(q, 0), shape(q, -1), shape(kv, 0), shape(indices, -1),
            dtype_code(q.dtype) if isinstance(q, Tensor) else -1, float_bits(sc),
            k_stride if isinstance(k_stride, int) else -1, qs, topk_length is not None, attn_sink is not None]

    def compare(allm):
        for i, arg, what in ((1, "q", "s_q ="), (2, "q", "d_qk ="), (3, "kv", "s_kv ="), (4, "indices", "topk ="),
                             (6, "sm_scale", "scale bits"), (7, "k_stride", "k_stride ="),
                             (8, "q_start", "q_start (-1 None, -2 a tensor) ="),
                             (9, "topk_length", "topk_length given (1) or not (0):"),
                             (10, "attn_sink", "attn_sink given (1) or not (0):")):
            require_equal(allm, i, arg, what)
        require_equal(allm, 5, "q", "dtype", err=TypeError, fmt=dtype_name)

    device = q.device if isinstance(q, Tensor) else torch.device("cpu")
    # the key: the shapes and flags, not q_start's value (compared on the first call, free to change afterwards)
    key = tuple(meta[1:8]) + (min(qs, 0),) + tuple(meta[9:]) + (device, shape(q, 1))
    checked_plan(op, group, rank, world, device, key, local_check, meta, compare, validate)
    return box["a"], group


class _TPSparseMLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, attn_sink, a, group):
        out, max_logits, lse = sparse_mla_fwd_op(a.q, a.kv, a.indices, a.sm_scale, a.d_v, a.attn_sink,
                                                 a.topk_length, a.q_start_t, a.q_start_int, a.causal, a.k_stride)
        ctx.mark_non_differentiable(max_logits)
        ctx.save_for_backward(a.q, a.kv, a.indices, a.attn_sink, a.topk_length, a.q_start_t, out, lse)
        ctx.scalars = (a.sm_scale, a.d_v, a.q_start_int, a.causal, a.k_stride)
        ctx.shapes = (q.shape, kv.shape, kv.dtype)
        ctx.group = group
        return out, max_logits, lse

    @staticmethod
    def backward(ctx, dout, dmax, dlse):
        q, kv, indices, attn_sink, topk_length, q_start_t, out, lse = ctx.saved_tensors
        sm_scale, d_v, q_start_int, causal, k_stride = ctx.scalars
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dkv, d_sink = sparse_mla_bwd_op(
            q, kv, out, dout, indices, lse, dlse, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int,
            causal, k_stride, torch.are_deterministic_algorithms_enabled(), True)
        dist.all_reduce(dkv, group=ctx.group)  # fp32 partial sums over this rank's heads -> all heads
        q_shape, kv_shape, kv_dtype = ctx.shapes
        return (dq.view(q_shape), dkv.to(kv_dtype).view(kv_shape), d_sink if attn_sink is not None else None,
                None, None)


def tp_sparse_mla(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = 512,
                  attn_sink: Optional[Tensor] = None, topk_length: Optional[Tensor] = None,
                  q_start: IntOrTensor = None, k_stride: int = 1, group=None, validate: bool = True):
    """sparse_mla on this rank's heads (q [s_q, h_r, d_qk], attn_sink [h_r]; kv, indices and the rest replicated).

    Returns this rank's (out [s_q, h_r, 512], max_logits, lse), as sparse_mla on these heads. Differentiable like
    sparse_mla; in the backward kv's gradient (an fp32 sum over this rank's heads) is all-reduced over `group` in
    fp32 and then cast to kv's dtype, so every rank's kv.grad equals the single-GPU one (up to the order of the
    fp32 additions); q's and attn_sink's gradients stay per head shard. validate: as context_parallel_decode.
    """
    a, group = _checked("tp_sparse_mla", group, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start,
                        k_stride, validate)
    return _TPSparseMLA.apply(q, kv, attn_sink, a, group)


def tp_sparse_mla_bwd(q: Tensor, kv: Tensor, out: Tensor, dout: Tensor, indices: Tensor, lse: Tensor,
                      sm_scale: float, d_v: int = 512, attn_sink: Optional[Tensor] = None,
                      topk_length: Optional[Tensor] = None, q_start: IntOrTensor = None, k_stride: int = 1,
                      deterministic: bool = False, dkv_dtype: Optional[torch.dtype] = None, group=None,
                      validate: bool = True):
    """sparse_mla_bwd on this rank's heads with dkv all-reduced (summed in fp32) over `group`: returns (dq of this
    rank's heads, the full dkv in dkv_dtype (default kv's)[, d_attn_sink of this rank's heads])."""
    _checked("tp_sparse_mla_bwd", group, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride,
             validate)
    if dkv_dtype not in (None, kv.dtype, torch.float32):
        raise ValueError(f"dkv_dtype must be None, kv's dtype or torch.float32, got {dkv_dtype}")
    res = sparse_mla_bwd(q, kv, out, dout, indices, lse, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride,
                         deterministic, dkv_dtype=torch.float32)
    dkv = res[1]
    dist.all_reduce(dkv, group=resolve_group(group)[0])
    dkv = dkv.to(dkv_dtype or kv.dtype)
    return (res[0], dkv) + tuple(res[2:])


def tp_sparse_mla_attn_dist(q: Tensor, kv: Tensor, indices: Tensor, lse: Tensor, sm_scale: float,
                            q_start: IntOrTensor = None, k_stride: int = 1, topk_length: Optional[Tensor] = None,
                            group=None, validate: bool = True) -> Tensor:
    """The full attention distribution [s_q, topk] fp32 (summed over ALL heads), the same on every rank: this
    rank's sparse_mla_attn_dist (its heads, its lse) all-reduced (sum) over `group`."""
    _, group = _checked("tp_sparse_mla_attn_dist", group, q, kv, indices, sm_scale, 512, None, topk_length, q_start,
                        k_stride, validate)
    d = sparse_mla_attn_dist(q, kv, indices, lse, sm_scale, q_start, k_stride, topk_length)
    dist.all_reduce(d, group=group)
    return d


def tp_indexer_kl_loss(index_logits: Tensor, q: Tensor, kv: Tensor, indices: Tensor, lse: Tensor, sm_scale: float,
                       q_start: IntOrTensor = None, k_stride: int = 1, topk_length: Optional[Tensor] = None,
                       group=None, validate: bool = True) -> Tensor:
    """indexer_kl_loss of the full distribution (tp_sparse_mla_attn_dist): on every rank the single-GPU loss, and
    index_logits' (replicated) gradient the single-GPU one. Do not sum the loss over the ranks."""
    d = tp_sparse_mla_attn_dist(q, kv, indices, lse, sm_scale, q_start, k_stride, topk_length, group, validate)
    return indexer_kl_loss(index_logits, q, kv, indices, lse, sm_scale, q_start, k_stride, topk_length, attn_dist=d)
