"""Sparse MLA backward: the `llmkernels::sparse_mla_bwd` custom op, its public function, and the autograd
formula of `llmkernels::sparse_mla_fwd` (registered here once the forward op module exists)."""
import importlib.util
from typing import Optional, Tuple, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, new_token, run_planned, skey, tkey, tracing
from ..._validate import check_bool, check_shape, check_tensor, check_unit_last_stride
from .bwd import BwdWsPlan, sparse_mla_bwd_launch
from .common import Checked, SparseArgs, bare, call_key, prepare, rebind, rebind_is_view


def _args(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal, k_stride):
    return SparseArgs(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, causal, q_start_int, q_start_t, k_stride)


@torch.library.custom_op("llmkernels::sparse_mla_bwd", mutates_args=())
def sparse_mla_bwd_op(
    q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, indices: torch.Tensor,
    lse: torch.Tensor, dlse: Optional[torch.Tensor], sm_scale: float, d_v: int, attn_sink: Optional[torch.Tensor],
    topk_length: Optional[torch.Tensor], q_start_t: Optional[torch.Tensor], q_start_int: int, causal: bool,
    k_stride: int, deterministic: bool, dkv_fp32: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical arguments (see common.prepare); returns dq, dkv [s_kv, d_qk], d_sink ([h_q], or [0] without sink)."""
    a = _args(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal, k_stride)
    return _bwd(a, out, dout, lse, dlse, deterministic, dkv_fp32)


def _bwd(a: SparseArgs, out, dout, lse, dlse, deterministic: bool, dkv_fp32: bool, plan=None):
    q, kv, attn_sink = a.q, a.kv, a.attn_sink
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if plan is not None:
        dkv, delta = plan(a, out, dout, lse, dq, attn_sink is not None)  # (the plan's key fixed dkv_fp32)
    else:
        dkv, delta = sparse_mla_bwd_launch(a, out, dout, lse, dlse, dq, deterministic=deterministic)
        dkv = dkv if dkv_fp32 else dkv.to(kv.dtype)
    d_sink = _d_sink(attn_sink, lse, delta) if attn_sink is not None else lse.new_empty(0)
    return dq, dkv, d_sink


def _d_sink(attn_sink, lse, delta):
    # d sink_h = -sum_i exp(sink_h - lse_ih) * Delta_ih (Delta already holds - dlse); lse = +inf rows give 0.
    # A sink of +inf takes the whole softmax (share 1, out 0): exp(inf - inf) would be NaN
    share = torch.where(attn_sink[None, :] == float("inf"), 1.0, torch.exp(attn_sink[None, :] - lse))
    return -(share * delta).sum(0)


def _bwd_raw(plan, q, kv, out, dout, indices, lse, attn_sink, topk_length, q_start):
    """A kept backward plan on the caller's tensors (BwdWsPlan.direct): no canonical arguments built; dkv comes in
    kv's shape."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dkv, delta = plan.run(q, kv, indices, topk_length, q_start if isinstance(q_start, torch.Tensor) else None, out,
                          dout, lse, dq, attn_sink is not None)
    return (dq, dkv) if attn_sink is None else (dq, dkv, _d_sink(attn_sink, lse, delta))


@sparse_mla_bwd_op.register_fake
def _(q, kv, out, dout, indices, lse, dlse, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal,
      k_stride, deterministic, dkv_fp32):
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dkv = kv.new_empty(kv.shape, dtype=torch.float32 if dkv_fp32 else kv.dtype)
    return dq, dkv, q.new_empty(attn_sink.shape[0] if attn_sink is not None else 0, dtype=torch.float32)


def sparse_mla_bwd(q, kv, out, dout, indices, lse, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None,
                   q_start: Union[None, int, torch.Tensor] = None, k_stride: int = 1, deterministic: bool = False,
                   dkv_dtype: Optional[torch.dtype] = None):
    """Gradients of the sparse MLA forward (`sparse_mla`) w.r.t. q and kv (and attn_sink).

    Args: the forward's arguments (q [s_q, h_q, d_qk], kv [s_kv, 1, d_qk] or [s_kv, d_qk], indices, sm_scale,
        d_v, attn_sink, topk_length, q_start, k_stride: same semantics and validity rules), plus the forward's
        out [s_q, h_q, 512] and lse [s_q, h_q] fp32 (natural log, +inf on rows with no valid index) and the
        upstream gradient dout [s_q, h_q, 512] (q's dtype).
        deterministic: False accumulates dkv with fp32 atomics (summation order varies between runs);
            True gives bitwise-identical dkv across runs (fixed-order reduction; slower, see the notes).
        dkv_dtype: None (kv's dtype) or torch.float32 (the fp32 accumulation itself).
    Returns:
        (dq, dkv), or (dq, dkv, d_attn_sink) when attn_sink is given. dq [s_q, h_q, d_qk] in q's dtype; dkv
        has kv's shape: each kv row collects the contributions of every listing of it (its K role over all
        d_qk dims, its V role over the first 512), accumulated in fp32; rows nobody selects are exactly 0.
        Invalid, causal-masked and beyond-topk_length indices contribute nothing and are never read.
        d_attn_sink [h_q] fp32.
    """
    raw = (q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride)
    qs_t = q_start if isinstance(q_start, torch.Tensor) else None
    key = None if tracing() else (_SITE, current_device(), *call_key(*raw), tkey(out), tkey(dout), tkey(lse),
                                  skey(deterministic), dkv_dtype)
    hit = kept_plan(key, (q, kv, out, dout, indices, lse, attn_sink, topk_length, qs_t))
    if hit is not None:
        if hit.raw_plan() is not None:
            return _bwd_raw(hit.plan, q, kv, out, dout, indices, lse, attn_sink, topk_length, q_start)
        a = rebind(hit.args, q, kv, indices, attn_sink, topk_length, q_start)
        return _public(run_planned(hit.token, _bwd, a, out, dout, lse, None, deterministic,
                                   dkv_dtype == torch.float32, hit.plan), kv, attn_sink)
    a = prepare(*raw)
    s_q, h_q, _ = a.q.shape
    for name, t in (("out", out), ("dout", dout)):
        check_tensor(name, t, dtypes=(a.q.dtype,), ndim=3)
        check_shape(name, t, (s_q, h_q, a.d_v), "[s_q, h_q, d_v]")
        check_unit_last_stride(name, t)
    check_tensor("lse", lse, dtypes=(torch.float32,), ndim=2)
    check_shape("lse", lse, (s_q, h_q), "[s_q, h_q]")
    check_bool("deterministic", deterministic)
    if dkv_dtype not in (None, kv.dtype, torch.float32):
        raise ValueError(f"dkv_dtype must be None, kv's dtype or torch.float32, got {dkv_dtype}")
    for name, t in (("out", out), ("dout", dout), ("lse", lse)):
        if t.device != a.q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {a.q.device}; all tensors must be on one device")
    fp32 = dkv_dtype == torch.float32
    # where the custom op would only run _bwd: call it (a kept plan for the default mode: see bwd.BwdWsPlan)
    hit = keep_plan(key, lambda: Checked(bare(a), new_token(), None if deterministic else BwdWsPlan.make(
        a, out, dout, lse, torch.empty_like(a.q), fp32), rebind_is_view(attn_sink, topk_length)),
        (q, kv, out, dout, indices, lse, attn_sink, topk_length, qs_t))
    if hit is not None:
        return _public(run_planned(hit.token, _bwd, a, out, dout, lse, None, deterministic, fp32, hit.plan), kv,
                       attn_sink)
    return _public(sparse_mla_bwd_op(
        a.q, a.kv, out, dout, a.indices, lse, None, a.sm_scale, a.d_v, a.attn_sink, a.topk_length, a.q_start_t,
        a.q_start_int, a.causal, a.k_stride, deterministic, dkv_dtype == torch.float32), kv, attn_sink)


_SITE = "sparse_mla_bwd"  # a checked call's key -> its common.Checked


def _public(grads, kv, attn_sink):
    dq, dkv, d_sink = grads
    dkv = dkv.view(kv.shape)
    return (dq, dkv, d_sink) if attn_sink is not None else (dq, dkv)


# --- autograd of the forward op ----------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal, k_stride = inputs
    out, max_logits, lse = output
    ctx.mark_non_differentiable(max_logits)  # a max has no useful gradient; documented as not differentiable
    ctx.save_for_backward(q, kv, indices, attn_sink, topk_length, q_start_t, out, lse)
    ctx.scalars = (sm_scale, d_v, q_start_int, causal, k_stride)


def _backward(ctx, dout, dmax, dlse):
    q, kv, indices, attn_sink, topk_length, q_start_t, out, lse = ctx.saved_tensors
    sm_scale, d_v, q_start_int, causal, k_stride = ctx.scalars
    if dout.stride(-1) != 1:  # e.g. the expanded gradient of out.sum()
        dout = dout.contiguous()
    dq, dkv, d_sink = sparse_mla_bwd_op(
        q, kv, out, dout, indices, lse, dlse, sm_scale, d_v, attn_sink, topk_length, q_start_t, q_start_int, causal,
        k_stride, torch.are_deterministic_algorithms_enabled(), False)
    return dq, dkv, None, None, None, (d_sink if attn_sink is not None else None), None, None, None, None, None


if importlib.util.find_spec(__package__ + ".op") is not None:  # the forward op module exists (merged)
    from . import op as _fwd_op  # noqa: F401  (registers llmkernels::sparse_mla_fwd)

    torch.library.register_autograd("llmkernels::sparse_mla_fwd", _backward, setup_context=_setup_context)
