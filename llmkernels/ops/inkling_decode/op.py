"""inkling_decode: one query token per sequence with a compact banded relative bias and an optional sliding window,
on xl_paged_decode's split-KV kernel (its REL / window / dense-layout variants)."""
from typing import Optional, Tuple, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, skey, tkey, tracing
from ..._validate import (check_bool, check_int, check_interpreter_dtype, check_same_device, check_scale,
                          check_tensor, check_unit_last_stride)
from ..xl_paged_decode.kernel import xl_plan
from ..xl_paged_decode.op import _DTYPES, _HEAD_DIMS, _cache_geometry, _validate_table, validate_lengths


@torch.library.custom_op("llmkernels::inkling_decode", mutates_args=())
def _inkling_decode_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_bias: torch.Tensor, lengths: torch.Tensor,
    block_tables: Optional[torch.Tensor], starts: Optional[torch.Tensor], window: int, scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(_plan(q, k, v, rel_bias, lengths, block_tables, starts, window, scale), q, k, v, rel_bias, lengths,
                block_tables, starts)


@_inkling_decode_op.register_fake
def _(q, k, v, rel_bias, lengths, block_tables, starts, window, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:2], dtype=torch.float32)


def _run(plan, q, k, v, rel_bias, lengths, block_tables, starts):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    plan(q, k, v, block_tables, lengths, None, rel_bias, out, lse, starts)
    return out, lse


_SITE = "inkling_decode"  # a checked call's key -> its plan


def _plan(q, k, v, rel_bias, lengths, block_tables, starts, window: int, scale: float):
    return xl_plan(q, k, v, block_tables, lengths, None, rel_bias, scale, rel=True, window=window,
                   starts=starts is not None)


def prepare(q, k, v, rel_bias, lengths, block_tables, window, starts, scale, return_lse, validate):
    """inkling_decode's argument checks (and, with validate, the host checks); returns (window (0: none), scale,
    return_lse)."""
    check_tensor("q", q, dtypes=_DTYPES, ndim=3)
    S, H, D = q.shape
    if D not in _HEAD_DIMS:
        raise ValueError(f"head dim D must be one of {_HEAD_DIMS}, got {D}")
    check_unit_last_stride("q", q)
    if block_tables is None:
        check_tensor("k", k, ndim=4)
        check_tensor("v", v, ndim=4)
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
        if k.shape[0] != S or k.shape[3] != D or tuple(v.shape) != tuple(k.shape):
            raise ValueError(f"without block_tables, k and v must be [S, Hkv, L, D] with S={S}, D={D} (transformers' "
                             f"cache layout), got k {tuple(k.shape)}, v {tuple(v.shape)}")
        hkv, max_len = k.shape[1], k.shape[2]
        if hkv == 0 or H % hkv:
            raise ValueError(f"q heads ({H}) must be a positive multiple of the cache's kv heads ({hkv})")
        check_unit_last_stride("k", k)
        check_unit_last_stride("v", v)
    else:
        nb, bs, hkv, _ = _cache_geometry(q, k, v)
        check_tensor("block_tables", block_tables, dtypes=(torch.int32,), ndim=2)
        if block_tables.shape[0] != S:
            raise ValueError(f"block_tables must have S={S} rows, got shape {tuple(block_tables.shape)}")
        max_len = block_tables.shape[1] * bs
    check_tensor("rel_bias", rel_bias, dtypes=_DTYPES, ndim=3)
    if rel_bias.shape[:2] != (S, H) or rel_bias.shape[2] < 1:
        raise ValueError(f"rel_bias must be [S, H, rel_extent] with S={S}, H={H}, rel_extent >= 1, "
                         f"got {tuple(rel_bias.shape)}")
    check_tensor("lengths", lengths, dtypes=(torch.int32,), ndim=1)
    if lengths.shape[0] != S:
        raise ValueError(f"lengths must have shape ({S},), got {tuple(lengths.shape)}")
    if starts is not None:
        check_tensor("starts", starts, dtypes=(torch.int32,), ndim=1)
        if starts.shape[0] != S:
            raise ValueError(f"starts must have shape ({S},), got {tuple(starts.shape)}")
    window = 0 if window is None else check_int("window", window, lo=1, hi=2 ** 31 - 1)
    scale = D ** -0.5 if scale is None else check_scale("scale", scale)
    check_same_device(q=q, k=k, v=v, rel_bias=rel_bias, lengths=lengths, block_tables=block_tables, starts=starts)
    check_interpreter_dtype(q=q)
    return_lse, validate = check_bool("return_lse", return_lse), check_bool("validate", validate)
    if validate:
        if block_tables is not None:
            _validate_table(block_tables, lengths, nb, bs, max_len, name="lengths")
        else:
            validate_lengths("lengths", lengths, max_len, label="L=")
    return window, scale, return_lse


def inkling_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    lengths: torch.Tensor,
    block_tables: Optional[torch.Tensor] = None,
    window: Optional[int] = None,
    starts: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    return_lse: bool = False,
    validate: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode one token per sequence with Inkling's relative-position attention: a compact banded bias, an optional
    sliding window, GQA.

    The query of sequence s is the cache's token len_s - 1 (its own key already written; len_s = lengths[s]);
    for heads h and keys t in [lo_s, len_s), lo_s = max(starts[s], len_s - window):
        logit_t = scale * q[s,h] . k_t + rel_bias[s, h, len_s - 1 - t]   (the bias is 0 at distances >= E)
        out[s,h] = softmax_t(logit) . v_t
    Keys below lo_s are never read: time follows min(len, window).

    Args:
        q: [S, H, D] fp32 / fp16 / bf16, unit last stride; D in {64, 80, 96, 128, 256}. Inkling's log-position
            temperature tau multiplies q and rel_bias before the call, as transformers does.
        k, v: q's dtype. Without block_tables, transformers' cache layout [S, Hkv, L, D] (any strides but a unit
            last one); with it, xl_paged_decode's paged layouts (NHD [num_blocks, block_size, Hkv, D] or vLLM's
            legacy 5-d k / 4-d v). H must be a multiple of Hkv.
        rel_bias: [S, H, E] (E = rel_extent >= 1), any float dtype, any strides: entry d is the bias at distance d.
        lengths: int32 [S]; clamped on the device to [0, L] (L = the cache's length, or max_blocks * block_size).
        block_tables: int32 [S, max_blocks] (see xl_paged_decode; entries past the used blocks are never read).
        window: None, or keys at distance >= window are not attended (transformers' sliding_window).
        starts: None or int32 [S]: keys below starts[s] are not attended (left padding).
        scale: default D ** -0.5 (Inkling: 1 / D, q and k being RMS-normalised).
        return_lse: also return lse [S, H] fp32 (natural log) for merging.
        validate: check lengths (and a table's used block ids) on the host first: ValueError where out of range.
            Syncs with the device, so not for CUDA-graph capture.
    Returns:
        out [S, H, D] in q's dtype (and lse). A row with no key (len 0, or lo >= len) gets out 0, lse -inf; a NaN in
        an attended key, value or bias entry makes its row NaN.
    """
    args = (q, k, v, rel_bias, lengths, block_tables, starts)
    key = None if tracing() else (_SITE, current_device(), tkey(q), tkey(k), tkey(v), tkey(rel_bias), tkey(lengths),
                                  tkey(block_tables), tkey(starts), skey(window), skey(scale), skey(return_lse),
                                  skey(validate))
    plan = kept_plan(key, args)
    if plan is not None:
        out, lse = _run(plan, *args)
        return (out, lse) if return_lse else out
    window, scale, return_lse = prepare(q, k, v, rel_bias, lengths, block_tables, window, starts, scale, return_lse,
                                        validate)
    contig = lengths.stride(0) == 1 and (starts is None or starts.stride(0) == 1)
    plan = keep_plan(key, lambda: _plan(*args, window, scale), args) if contig and not validate else None
    if plan is not None:
        out, lse = _run(plan, *args)
    else:
        out, lse = _inkling_decode_op(q, k, v, rel_bias, lengths.contiguous(), block_tables,
                                      None if starts is None else starts.contiguous(), window, scale)
    return (out, lse) if return_lse else out
