"""The DSA (DeepSeek-V3.2 / GLM-5) lightning indexer in kernels: dsa_index_scores (the scores of a chunk of keys, for
the top-k) and dsa_topk_logits (the scores at the selected keys, differentiable: the indexer loss's input)."""
from typing import Optional, Tuple

import torch

from ..._launch import current_device, keep_plan, kept_plan, skey, tkey, tracing
from ..._runtime import interpreting, sm_count
from ..._validate import check_interpreter_dtype, check_same_device, check_tensor
from .kernel import launch, topk_logits_launch

_IN = (torch.float16, torch.bfloat16)


@torch.library.custom_op("llmkernels::dsa_index_scores", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, positions: Optional[torch.Tensor],
        sm_scale: float, key_start: int, key_end: int) -> torch.Tensor:
    return _scores(q, k, weights, positions, sm_scale, key_start, key_end)


def _scores(q, k, weights, positions, sm_scale: float, key_start: int, key_end: int) -> torch.Tensor:
    B, S = q.shape[:2]
    if interpreting():
        q, k = q.contiguous(), k.contiguous()
    out = torch.empty(B, S, key_end - key_start, dtype=torch.float32, device=q.device)
    if out.numel():
        sms = 1 if q.device.type != "cuda" else sm_count(q.device.index or 0)
        launch(q, k, weights, positions, out, sm_scale, key_start, key_end - key_start, sms)
    return out


@_op.register_fake
def _(q, k, weights, positions, sm_scale, key_start, key_end):
    return q.new_empty(q.shape[0], q.shape[1], key_end - key_start, dtype=torch.float32)


def _check_qkw(q, k, weights, sm_scale):
    """The checks both ops make of q [B, S, H, D], k [B, T, D], weights [B, S, H] and sm_scale; returns (B, S, H, D)."""
    check_tensor("q", q, dtypes=_IN, ndim=4)
    check_tensor("k", k, dtypes=_IN, ndim=3)
    check_tensor("weights", weights, dtypes=(torch.float32,), ndim=3)
    B, S, H, D = q.shape
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if k.shape[0] != B or k.shape[2] != D:
        raise ValueError(f"k must be [B={B}, T, D={D}] like q [B, S, H, D], got {tuple(k.shape)}")
    if tuple(weights.shape) != (B, S, H):
        raise ValueError(f"weights must be [B, S, H] = {(B, S, H)}, got {tuple(weights.shape)}")
    if D & (D - 1) or not 16 <= D <= 256:
        raise ValueError(f"the head dim D must be a power of two in 16..256, got {D}")
    if H > 128:
        raise ValueError(f"at most 128 indexer heads, got {H}")
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool) or not sm_scale > 0:
        raise ValueError(f"sm_scale must be a positive float, got {sm_scale!r}")
    return B, S, H, D


def dsa_index_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, sm_scale: float,
                     positions: Optional[torch.Tensor] = None, key_start: int = 0,
                     key_end: Optional[int] = None) -> torch.Tensor:
    """The DSA indexer's scores of keys key_start..key_end: fp32 [B, S, key_end - key_start],

        scores[b, s, t] = sum_h weights[b, s, h] * relu(sm_scale * q[b, s, h] . k[b, t]),

    and -inf where t > positions[b, s] (causal by position; key blocks past a query tile's last position are never
    read). As transformers' DeepseekV32Indexer / GlmMoeDsaIndexer score before their top-k, without its [B, S, heads, T]
    fp32 products: fp16 / bf16 products summed in fp32 (bf16 x bf16 products are exact in fp32; the sums' order
    differs from a fp32 matmul's by rounding).

    q [B, S, H, D] and k [B, T, D] fp16 / bf16 (one dtype; D a power of two, 16-256; unit stride in D); weights
    [B, S, H] fp32 (transformers' weights_proj output times H^-0.5); positions [B or 1, S] int32 / int64, or None (no
    mask). NaN in q, k or weights gives NaN scores where they reach (a NaN key: that key's column; the top-k over them
    is then torch.topk's). Differentiable: no (the indexer selects under no_grad)."""
    key = None if tracing() else (_SCORES, current_device(), tkey(q), tkey(k), tkey(weights), skey(sm_scale),
                                  tkey(positions), skey(key_start), skey(key_end))
    plan = kept_plan(key, (q, k, weights, positions))  # (key_end, positions expanded over B)
    if plan is not None:
        if plan[1]:
            positions = positions.expand(q.shape[0], -1)
        return _scores(q, k, weights, positions, float(sm_scale), key_start, plan[0])
    B, S, H, D = _check_qkw(q, k, weights, sm_scale)
    if q.stride(3) != 1 or k.stride(2) != 1 or weights.stride(2) != 1:
        raise ValueError("q, k and weights must have unit stride in their last dim")
    T = k.shape[1]
    if isinstance(key_start, bool) or not isinstance(key_start, int) or not 0 <= key_start <= T:
        raise ValueError(f"key_start must be an int in [0, T={T}], got {key_start!r}")
    key_end = T if key_end is None else key_end
    if isinstance(key_end, bool) or not isinstance(key_end, int) or not key_start <= key_end <= T:
        raise ValueError(f"key_end must be an int in [key_start={key_start}, T={T}], got {key_end!r}")
    if positions is not None:
        check_tensor("positions", positions, dtypes=(torch.int32, torch.int64), ndim=2)
        if positions.shape[0] not in (1, B) or positions.shape[1] != S or positions.stride(1) != 1:
            raise ValueError(f"positions must be [B={B} or 1, S={S}] with unit stride in S, got "
                             f"{tuple(positions.shape)}")
    expand = positions is not None and positions.shape[0] == 1 and B > 1
    if expand:
        positions = positions.expand(B, S)
    check_same_device(q=q, k=k, weights=weights, positions=positions)
    check_interpreter_dtype(q=q)
    if keep_plan(key, lambda: (key_end, expand), (q, k, weights, positions)):  # the custom op would only run it
        return _scores(q, k, weights, positions, float(sm_scale), key_start, key_end)
    return _op(q, k, weights, positions, float(sm_scale), key_start, key_end)


_SCORES = "dsa_index_scores"  # a checked call's key -> (key_end, positions expanded over B)


@torch.library.custom_op("llmkernels::dsa_topk_logits", mutates_args=())
def _logits_op(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
               sm_scale: float) -> torch.Tensor:
    return _logits(q, k, weights, indices, sm_scale)


def _logits(q, k, weights, indices, sm_scale: float) -> torch.Tensor:
    out = torch.empty(indices.shape, dtype=torch.float32, device=q.device)
    if out.numel():
        topk_logits_launch(q, k, weights, indices, sm_scale, out=out)
    return out


@_logits_op.register_fake
def _(q, k, weights, indices, sm_scale):
    return q.new_empty(indices.shape, dtype=torch.float32)


@torch.library.custom_op("llmkernels::dsa_topk_logits_bwd", mutates_args=())
def _logits_bwd_op(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                   sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dw = torch.zeros(weights.shape, dtype=torch.float32, device=q.device)
    if indices.numel():
        topk_logits_launch(q, k, weights, indices, sm_scale, g=g.contiguous(), dq=dq, dk=dk, dw=dw)
    return dq.to(q.dtype), dk.to(k.dtype), dw


@_logits_bwd_op.register_fake
def _(g, q, k, weights, indices, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(weights)


def _setup(ctx, inputs, output):
    q, k, weights, indices, sm_scale = inputs
    ctx.save_for_backward(q, k, weights, indices)
    ctx.sm_scale = sm_scale


def _backward(ctx, g):
    q, k, weights, indices = ctx.saved_tensors
    dq, dk, dw = _logits_bwd_op(g, q, k, weights, indices, ctx.sm_scale)
    return dq, dk, dw, None, None


_logits_op.register_autograd(_backward, setup_context=_setup)


def dsa_topk_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                    sm_scale: float) -> torch.Tensor:
    """The DSA indexer's scores at the selected keys: fp32 [B, S, topk],

        logits[b, s, j] = sum_h weights[b, s, h] * relu(sm_scale * q[b, s, h] . k[b, indices[b, s, j]]),

    0 where indices[b, s, j] is not a key (-1, or >= T). Differentiable w.r.t. q, k and weights (the indexer loss's
    gradient to the indexer, llmkernels.indexer_kl_loss taking these logits): the backward recomputes the products
    (nothing [S, H, topk] is kept), its per-key sums fp16 / bf16 operands with fp32 accumulation, k's gradient added
    atomically (summation order varies from run to run). Shapes and dtypes as dsa_index_scores; indices int32."""
    key = None if tracing() else (_LOGITS, current_device(), tkey(q), tkey(k), tkey(weights), tkey(indices),
                                  skey(sm_scale))
    if kept_plan(key, (q, k, weights, indices)):  # (no gradient wanted: direct_ok)
        return _logits(*_unit_last(q, k, weights, indices), float(sm_scale))
    B, S, H, D = _check_qkw(q, k, weights, sm_scale)
    check_tensor("indices", indices, dtypes=(torch.int32,), ndim=3)
    if tuple(indices.shape[:2]) != (B, S):
        raise ValueError(f"indices must be [B={B}, S={S}, topk], got {tuple(indices.shape)}")
    check_same_device(q=q, k=k, weights=weights, indices=indices)
    check_interpreter_dtype(q=q)
    q, k, weights, indices = _unit_last(q, k, weights, indices)
    if keep_plan(key, lambda: True, (q, k, weights, indices)):
        return _logits(q, k, weights, indices, float(sm_scale))
    return _logits_op(q, k, weights, indices, float(sm_scale))


def _unit_last(*ts):
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in ts)


_LOGITS = "dsa_topk_logits"  # a checked call's key -> True
