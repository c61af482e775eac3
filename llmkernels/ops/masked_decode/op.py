"""masked_decode: single-token GQA decode with a per-(batch, kv-head, token) drop mask."""
from typing import Optional, Tuple, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, skey, tkey, tracing
from ..._validate import (check_interpreter_dtype, check_same_device, check_scale, check_shape, check_tensor,
                          check_unit_last_stride)
from .kernel import decode_plan

_DTYPES = (torch.float16, torch.bfloat16)
_HEAD_DIMS = (64, 128, 256)


@torch.library.custom_op("llmkernels::masked_decode", mutates_args=())
def _masked_decode_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, drop_mask: Optional[torch.Tensor],
    kv_lens: Optional[torch.Tensor], kv_len: int, sm_scale: float, kept_idx: Optional[torch.Tensor] = None,
    kept_len: Optional[torch.Tensor] = None, dense_from: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    listed = (kept_idx, dense_from) if kept_len is not None else None
    return _run(decode_plan(q, k, v, drop_mask, kv_lens, kv_len, sm_scale, listed), q, k, v, drop_mask, kv_lens,
                kept_idx, kept_len)


def _run(plan, q, k, v, drop_mask, kv_lens, kept_idx=None, kept_len=None):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    plan(q, k, v, drop_mask, kv_lens, out, lse, kept_idx, kept_len)
    return out, lse


_SITE = "masked_decode"  # a checked call's key -> (plan, q is 4-d)


@_masked_decode_op.register_fake
def _(q, k, v, drop_mask, kv_lens, kv_len, sm_scale, kept_idx=None, kept_len=None, dense_from=0):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:2], dtype=torch.float32)


def prepare(q, k, v, drop_mask, kv_len, sm_scale, names=("k", "v")):
    """masked_decode's argument checks (errors name k and v as `names`); returns the launcher's arguments
    (q [B, Hq, D], k, v, drop_mask, kv_lens int32/int64 tensor or None, kv_len int, scale, squeeze: q was 4-d)."""
    kn, vn = names
    check_tensor("q", q, dtypes=_DTYPES, ndim=(3, 4))
    squeeze = q.dim() == 4
    if squeeze:
        if q.shape[2] != 1:
            raise ValueError(f"q must be [B, Hq, D] or [B, Hq, 1, D] (one new token), got shape {tuple(q.shape)}")
        q = q[:, :, 0]
    check_tensor(kn, k, ndim=4)
    check_tensor(vn, v, ndim=4)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, {kn} and {vn} must share one dtype, got q {q.dtype}, {kn} {k.dtype}, {vn} {v.dtype}")
    B, Hq, D = q.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{kn} and {vn} must have the same shape, got {kn} {tuple(k.shape)} and {vn} "
                         f"{tuple(v.shape)}")
    Bk, Hkv, L, Dk = k.shape
    if Bk != B:
        raise ValueError(f"{kn} has batch {Bk} but q has batch {B}")
    if Dk != D:
        raise ValueError(f"{kn} has head dim {Dk} but q has head dim {D}")
    if D not in _HEAD_DIMS:
        raise ValueError(f"head dim D must be one of {_HEAD_DIMS}, got {D}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a positive multiple of {kn}/{vn} heads ({Hkv})")
    for name, t in (("q", q), (kn, k), (vn, v)):
        check_unit_last_stride(name, t)
    if drop_mask is not None:
        check_tensor("drop_mask", drop_mask, dtypes=(torch.bool,))
        check_shape("drop_mask", drop_mask, (B, Hkv, L), "[B, Hkv, L], True = drop")
    kv_lens = None
    if kv_len is None:
        kv_len_int = L
    elif isinstance(kv_len, torch.Tensor):
        check_tensor("kv_len", kv_len, dtypes=(torch.int32, torch.int64))
        check_shape("kv_len", kv_len, (B,), "one length per sequence")
        kv_lens = kv_len.contiguous()  # clamped to [0, L] in the kernel, in its own dtype (2**32 + 3 stays big)
        kv_len_int = L
    elif isinstance(kv_len, int) and not isinstance(kv_len, bool):
        if not 0 <= kv_len <= L:
            raise ValueError(f"kv_len must be in [0, L={L}], got {kv_len}")
        kv_len_int = kv_len
    else:
        raise TypeError(f"kv_len must be None, an int or an int tensor [B], got {type(kv_len).__name__}")
    scale = D ** -0.5 if sm_scale is None else check_scale("sm_scale", sm_scale)
    check_same_device(**{"q": q, kn: k, vn: v, "drop_mask": drop_mask, "kv_len": kv_lens})
    check_interpreter_dtype(q=q)
    return q, k, v, drop_mask, kv_lens, kv_len_int, scale, squeeze


def prepare_kept(q, k, drop_mask, kept_idx, kept_len, dense_from):
    """The kept lists' checks: (kept_idx or None (a prefix), kept_len contiguous, dense_from int), or None without
    lists."""
    if kept_idx is None and kept_len is None:
        if dense_from is not None:
            raise ValueError("dense_from goes with kept_len (and kept_idx)")
        return None
    if kept_len is None:
        raise ValueError("kept_idx needs kept_len (how many of each row's entries count)")
    if drop_mask is not None:
        raise ValueError("pass drop_mask or kept_idx / kept_len, not both")
    B, Hkv, L = k.shape[0], k.shape[1], k.shape[2]
    if kept_idx is not None:
        check_tensor("kept_idx", kept_idx, dtypes=(torch.int32,), ndim=3)
        if tuple(kept_idx.shape[:2]) != (B, Hkv):
            raise ValueError(f"kept_idx must be [B={B}, Hkv={Hkv}, M], got shape {tuple(kept_idx.shape)}")
    check_tensor("kept_len", kept_len, dtypes=(torch.int32,))
    check_shape("kept_len", kept_len, (B, Hkv), "one count per (sequence, KV head)")
    if dense_from is None:
        dense_from = L
    if not isinstance(dense_from, int) or isinstance(dense_from, bool):
        raise TypeError(f"dense_from must be an int in [0, L={L}], got {type(dense_from).__name__}")
    if not 0 <= dense_from <= L:
        raise ValueError(f"dense_from must be an int in [0, L={L}], got {dense_from}")
    check_same_device(q=q, kept_idx=kept_idx, kept_len=kept_len)
    return kept_idx, kept_len.contiguous(), dense_from


def masked_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    drop_mask: Optional[torch.Tensor] = None,
    kv_len: Union[None, int, torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    kept_idx: Optional[torch.Tensor] = None,
    kept_len: Optional[torch.Tensor] = None,
    dense_from: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decode one new token per sequence against its KV cache, dropping masked cache tokens.

    Args:
        q: [B, Hq, D] or [B, Hq, 1, D], fp16 or bf16, unit last stride.
        k, v: [B, Hkv, L, D], same dtype as q; any strides with a unit last stride (a view into a
            larger preallocated cache works). Hq must be a multiple of Hkv; D in {64, 128, 256}.
        drop_mask: optional bool [B, Hkv, L]. **True drops the token** (masked_fill convention): the
            token gets no attention weight and its K/V rows are never read from memory.
        kv_len: valid cache length. None (all L), an int in [0, L], or an int32/int64 tensor [B] of
            per-sequence lengths (read on the device, no host sync; values are clamped to [0, L] there).
        sm_scale: logit scale, default D ** -0.5.
        kept_idx, kept_len, dense_from: the kept tokens as lists instead of a drop_mask, so that the time follows
            their number (a mask's tiles are all visited): kept_idx int32 [B, Hkv, M] positions in any order,
            kept_len int32 [B, Hkv] how many of each row's entries count (clamped to [0, M]), and dense_from an int
            in [0, L] (default L): row (b, h) attends to its listed positions below min(dense_from, kv_len) (other
            entries are skipped, never read) and to every position from dense_from up to kv_len (the tokens added
            since the lists were made). A position listed twice counts twice. `kept_lists(drop_mask)` builds them.
            kept_len without kept_idx: row (b, h) keeps its first kept_len[b, h] positions (below dense_from), as
            in a cache whose kept tokens were moved to the front of each row: read as contiguous tiles, no list.
    Returns:
        (out, lse): out has q's shape and dtype; lse [B, Hq] fp32 is the natural-log log-sum-exp of the
        scaled logits of the kept tokens. A row with no kept token gets out = 0 and lse = -inf.
    Eager calls repeating a checked call's shapes, strides, dtypes and scalars reuse its launch plan (see _launch.py).
    """
    lens_t = kv_len if isinstance(kv_len, torch.Tensor) else None
    key = None if tracing() else (_SITE, current_device(), tkey(q), tkey(k), tkey(v), tkey(drop_mask), tkey(lens_t),
                                  skey(kv_len) if lens_t is None else None, skey(sm_scale), tkey(kept_idx),
                                  tkey(kept_len), skey(dense_from))
    hit = kept_plan(key, (q, k, v, drop_mask, lens_t, kept_idx, kept_len))
    if hit is not None:
        plan, squeeze = hit
        out, lse = _run(plan, q[:, :, 0] if squeeze else q, k, v, drop_mask,
                        lens_t.contiguous() if lens_t is not None else None, kept_idx,
                        kept_len.contiguous() if kept_len is not None else None)
        return (out.unsqueeze(2) if squeeze else out), lse
    q, k, v, drop_mask, kv_lens, kv_len_int, scale, squeeze = prepare(q, k, v, drop_mask, kv_len, sm_scale)
    kept = prepare_kept(q, k, drop_mask, kept_idx, kept_len, dense_from)
    ki, kl, df = kept if kept is not None else (None, None, 0)
    listed = (ki, df) if kl is not None else None
    hit = keep_plan(key, lambda: (decode_plan(q, k, v, drop_mask, kv_lens, kv_len_int, scale, listed), squeeze),
                    (q, k, v, drop_mask, kv_lens, ki, kl))  # where the custom op would only run _run
    if hit is not None:
        out, lse = _run(hit[0], q, k, v, drop_mask, kv_lens, ki, kl)
    else:
        out, lse = _masked_decode_op(q, k, v, drop_mask, kv_lens, kv_len_int, scale, ki, kl, df)
    return (out.unsqueeze(2) if squeeze else out), lse


def kept_lists(drop_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """masked_decode's kept lists from a drop mask [B, Hkv, L] (True = drop): (kept_idx int32 [B, Hkv, L], each
    row's kept positions in order first, kept_len int32 [B, Hkv]). Pass dense_from=L to decode new tokens beyond
    the mask without rebuilding the lists."""
    check_tensor("drop_mask", drop_mask, dtypes=(torch.bool,), ndim=3)
    order = torch.argsort(drop_mask.to(torch.uint8), dim=-1, stable=True)  # kept (0) first, in position order
    return order.to(torch.int32), (~drop_mask).sum(-1, dtype=torch.int32)
