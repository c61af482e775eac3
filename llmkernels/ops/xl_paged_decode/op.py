"""xl_paged_decode: paged-KV decode with Transformer-XL relative-position terms (content bias u, positional bd)."""
from typing import Optional, Tuple, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, skey, tkey, tracing
from ..._validate import (check_bool, check_interpreter_dtype, check_same_device, check_scale, check_tensor,
                          check_unit_last_stride)
from .kernel import xl_plan

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HEAD_DIMS = (64, 80, 96, 128, 256)
_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)


@torch.library.custom_op("llmkernels::xl_paged_decode", mutates_args=())
def _xl_paged_decode_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, u: Optional[torch.Tensor], bd: Optional[torch.Tensor], scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    plan = xl_plan(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale)
    return _run(plan, q, k_cache, v_cache, block_tables, context_lens, u, bd)


def _run(plan, q, k_cache, v_cache, block_tables, context_lens, u, bd):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    plan(q, k_cache, v_cache, block_tables, context_lens, u, bd, out, lse)
    return out, lse


_SITE = "xl_paged_decode"  # a checked call's key -> its plan


@_xl_paged_decode_op.register_fake
def _(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:2], dtype=torch.float32)


def _cache_geometry(q, k_cache, v_cache):
    """Checks both caches against q; returns (num_blocks, block_size, Hkv, legacy)."""
    S, H, D = q.shape
    check_tensor("k_cache", k_cache, ndim=(4, 5))
    check_tensor("v_cache", v_cache, ndim=4)
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache and v_cache must share one dtype, got q {q.dtype}, "
                        f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype}")
    legacy = k_cache.dim() == 5
    if legacy:
        x = 16 // q.element_size()
        nb, hkv, dx, bs, kx = k_cache.shape
        if kx != x or dx * kx != D:
            raise ValueError(f"legacy k_cache must be [num_blocks, Hkv, D/x, block_size, x] with x = 16 bytes / "
                             f"element size = {x} and D = {D}, got shape {tuple(k_cache.shape)}")
        if tuple(v_cache.shape) != (nb, hkv, D, bs):
            raise ValueError(f"with a legacy 5-d k_cache, v_cache must be [num_blocks, Hkv, D, block_size] = "
                             f"{(nb, hkv, D, bs)}, got {tuple(v_cache.shape)}")
        # the kernel addresses inside one (block, head) slab with compile-time strides (16-byte loads)
        if k_cache.stride()[2:] != (bs * x, x, 1) and nb * hkv > 0:
            raise ValueError(f"legacy k_cache must be contiguous in its last three dims, "
                             f"got strides {k_cache.stride()}")
        if v_cache.stride()[2:] != (bs, 1) and nb * hkv > 0:
            raise ValueError(f"legacy v_cache must be contiguous in its last two dims, got strides {v_cache.stride()}")
        if v_cache.stride(0) % bs or v_cache.stride(1) % bs:  # runs of tokens start at multiples of block_size
            raise ValueError(f"legacy v_cache's block and head strides must be multiples of block_size={bs}, "
                             f"got strides {v_cache.stride()}")
    else:
        nb, bs, hkv, dk = k_cache.shape
        if dk != D:
            raise ValueError(f"k_cache has head dim {dk} but q has head dim {D}")
        if tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(f"NHD k_cache and v_cache must have the same shape [num_blocks, block_size, Hkv, D], "
                             f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        check_unit_last_stride("k_cache", k_cache)
        check_unit_last_stride("v_cache", v_cache)
    if nb < 1:
        raise ValueError("k_cache must hold at least one block")
    if bs not in _BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {_BLOCK_SIZES}, got {bs}")
    if hkv == 0 or H % hkv != 0:
        raise ValueError(f"q heads ({H}) must be a positive multiple of the cache's kv heads ({hkv})")
    return nb, bs, hkv, legacy


def validate_lengths(name: str, lengths, max_len: int, label: str = "", note: str = ""):
    """Host-side check (syncs): every entry of lengths in [0, max_len], else ValueError "<name>[s] = v is outside
    [0, <label><max_len>]<note>"; returns the lengths on the host as int64."""
    lens = lengths.cpu().long()
    bad = ((lens < 0) | (lens > max_len)).nonzero()
    if bad.numel():
        s = bad[0, 0].item()
        raise ValueError(f"{name}[{s}] = {lens[s].item()} is outside [0, {label}{max_len}]{note}")
    return lens


def _validate_table(block_tables, context_lens, num_blocks: int, block_size: int, max_len: int,
                    name: str = "context_lens") -> None:
    """Host-side check (syncs): context_lens in [0, max_len] and every used block id in [0, num_blocks)."""
    lens = validate_lengths(name, context_lens, max_len,
                            note=" (max_blocks * block_size, and bd's last dim when bd is given)")
    tbl = block_tables.cpu().long()
    used = torch.arange(tbl.shape[1])[None, :] < ((lens + block_size - 1) // block_size)[:, None]
    bad = (used & ((tbl < 0) | (tbl >= num_blocks))).nonzero()
    if bad.numel():
        s, b = bad[0].tolist()
        raise ValueError(f"block_tables[{s}, {b}] = {tbl[s, b].item()} is a used block outside [0, {num_blocks})")


def prepare(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale, return_lse: bool = False,
            validate: bool = False):
    """xl_paged_decode's argument checks (and the host table check when validate); returns (scale, return_lse)."""
    check_tensor("q", q, dtypes=_DTYPES, ndim=3)
    S, H, D = q.shape
    if D not in _HEAD_DIMS:
        raise ValueError(f"head dim D must be one of {_HEAD_DIMS}, got {D}")
    check_unit_last_stride("q", q)
    nb, bs, hkv, _ = _cache_geometry(q, k_cache, v_cache)
    check_tensor("block_tables", block_tables, dtypes=(torch.int32,), ndim=2)
    if block_tables.shape[0] != S:
        raise ValueError(f"block_tables must have S={S} rows, got shape {tuple(block_tables.shape)}")
    check_tensor("context_lens", context_lens, dtypes=(torch.int32,), ndim=1)
    if context_lens.shape[0] != S:
        raise ValueError(f"context_lens must have shape ({S},), got {tuple(context_lens.shape)}")
    if u is not None:
        check_tensor("u", u, dtypes=_DTYPES, ndim=(2, 3))
        if tuple(u.shape) not in ((S, H, D), (H, D)):
            raise ValueError(f"u must be [S, H, D] = {(S, H, D)} or [H, D] = {(H, D)}, got {tuple(u.shape)}")
        check_unit_last_stride("u", u)
    if bd is not None:
        check_tensor("bd", bd, dtypes=_DTYPES, ndim=3)
        if bd.shape[:2] != (S, H):
            raise ValueError(f"bd must be [S, H, max_context] with S={S}, H={H}, got {tuple(bd.shape)}")
    scale = D ** -0.5 if scale is None else check_scale("scale", scale)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                      context_lens=context_lens, u=u, bd=bd)
    check_interpreter_dtype(q=q)
    return_lse, validate = check_bool("return_lse", return_lse), check_bool("validate", validate)
    if validate:
        max_len = block_tables.shape[1] * bs if bd is None else min(block_tables.shape[1] * bs, bd.shape[-1])
        _validate_table(block_tables, context_lens, nb, bs, max_len)
    return scale, return_lse


def xl_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    u: Optional[torch.Tensor] = None,
    bd: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    return_lse: bool = False,
    validate: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode one token per sequence against a paged KV cache with Transformer-XL relative-position terms.

    For sequence s, head h and cached token j < context_lens[s]:
        logit_j = scale * ((q[s,h] + u[s,h]) . k_j + bd[s,h,j]),   out[s,h] = softmax_j(logit) . v_j

    Args:
        q: [S, H, D], fp32/fp16/bf16, unit last stride. D in {64, 80, 96, 128, 256}.
        k_cache, v_cache: q's dtype, in one of two layouts (chosen by k_cache's rank):
            vLLM legacy: k [num_blocks, Hkv, D/x, block_size, x] (x = 16 bytes / element size), contiguous in
            its last three dims, and v [num_blocks, Hkv, D, block_size], contiguous in its last two;
            NHD: k and v [num_blocks, block_size, Hkv, D], unit last stride.
            block_size is a power of two in [8, 256]; H must be a multiple of Hkv (GQA).
        block_tables: int32 [S, max_blocks]; token j of sequence s lives in block block_tables[s, j // block_size]
            at offset j % block_size. Entries past the used blocks are never read (they may hold garbage).
        context_lens: int32 [S]; clamped on the device to [0, max_blocks * block_size] (and to bd.shape[-1]).
        u: pos_bias_u, [S, H, D] or [H, D], any float dtype, unit last stride; None = no content bias.
        bd: matrix_bd, [S, H, >= max context], any float dtype and any strides; only bd[s, h, :context] is read.
        scale: default D ** -0.5; it multiplies bd too ((ac + bd) * scale).
        return_lse: also return lse [S, H] fp32, the natural-log log-sum-exp of the logits (for merging).
        validate: check the table on the host first and raise ValueError on a context length out of range or a
            used block id outside [0, num_blocks). Syncs with the device, so not for CUDA-graph capture.
    Returns:
        out [S, H, D] in q's dtype (and lse when return_lse). A sequence with context 0 gets out 0, lse -inf.
        Without validate, a used block whose id is outside [0, num_blocks) is never read: its tokens are
        skipped (no weight), so the row attends to the remaining tokens (out 0, lse -inf if none remain).
    Eager calls repeating a checked call's shapes, strides, dtypes and scalars reuse its launch plan (see _launch.py).
    """
    args = (q, k_cache, v_cache, block_tables, context_lens, u, bd)
    key = None if tracing() else (_SITE, current_device(), tkey(q), tkey(k_cache), tkey(v_cache), tkey(block_tables),
                                  tkey(context_lens), tkey(u), tkey(bd), skey(scale), skey(return_lse), skey(validate))
    plan = kept_plan(key, args)
    if plan is not None:
        out, lse = _run(plan, *args)
        return (out, lse) if return_lse else out
    scale, return_lse = prepare(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale, return_lse,
                                validate)
    # where the custom op would only run _run: call it, and let the next call with this key skip the checks
    plan = keep_plan(key, lambda: xl_plan(*args, scale), args) if context_lens.stride(0) == 1 and not validate \
        else None
    if plan is not None:
        out, lse = _run(plan, *args)
    else:
        out, lse = _xl_paged_decode_op(q, k_cache, v_cache, block_tables, context_lens.contiguous(), u, bd, scale)
    return (out, lse) if return_lse else out
