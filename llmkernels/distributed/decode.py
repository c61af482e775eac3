"""Context-parallel decode: the KV cache split along the sequence over the ranks of a process group."""
from typing import Callable, NamedTuple, Optional, Tuple, Union

import torch
import triton
import triton.language as tl

from .._runtime import cdiv
from .._validate import check_bool, check_int, check_tensor
from ..ops.masked_decode.kernel import masked_decode_fwd
from ..ops.masked_decode.op import prepare as masked_prepare
from ..ops.xl_paged_decode.kernel import xl_paged_decode_fwd
from ..ops.xl_paged_decode.op import prepare as xl_prepare
from ._comm import checked_plan, dtype_code, dtype_name, float_bits, gather_merge, require_equal, resolve_group


@triton.jit(do_not_specialize=["B", "offset", "L", "rank", "world", "page"])  # runtime ints (a 1 is not constexpr)
def _local_lens_kernel(kv_len_ptr, out_ptr, B, offset, L, rank, world, page, INTERLEAVE: tl.constexpr,
                       BLOCK: tl.constexpr):
    """This rank's share of each global length (int64 math, clamped to [0, L]): contiguous ranges
    (tokens [offset, offset + L)) or pages of `page` tokens dealt round-robin (global page p on rank p % world)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = tl.maximum(tl.load(kv_len_ptr + i, mask=i < B, other=0).to(tl.int64), 0)
    if INTERLEAVE:
        cycle = page.to(tl.int64) * world
        full = n // cycle
        rest = n - full * cycle - rank.to(tl.int64) * page
        local = full * page + tl.minimum(tl.maximum(rest, 0), page)
    else:
        local = n - offset
    tl.store(out_ptr + i, tl.minimum(tl.maximum(local, 0), L).to(tl.int32), mask=i < B)


def _local_int(n: int, offset: int, L: int, rank: int, world: int, page: int) -> int:
    """_local_lens_kernel for an int length, on the host."""
    n = max(n, 0)
    if page:
        full, rest = divmod(n, page * world)
        local = full * page + min(max(rest - rank * page, 0), page)
    else:
        local = n - offset
    return min(max(local, 0), L)


# metadata sent by context_parallel_decode's check: positions in the vector
_ERR, _B, _HQ, _HKV, _D, _DT, _L, _SCALE, _KVKIND, _PAGE, _OFF, _XDT = range(12)


def _compare_decode(allm):
    require_equal(allm, _B, "q", "batch B =")
    require_equal(allm, _HQ, "q", "query heads Hq =")
    require_equal(allm, _HKV, "k_shard", "kv heads Hkv =")
    require_equal(allm, _D, "q", "head dim D =")
    require_equal(allm, _DT, "q", "dtype", err=TypeError, fmt=dtype_name)
    require_equal(allm, _SCALE, "sm_scale", "scale bits")
    require_equal(allm, _KVKIND, "kv_len", "kind (0 None, 1 int, 2 tensor)")
    require_equal(allm, _PAGE, "interleave", "page size")
    require_equal(allm, _XDT, "exchange_dtype", "dtype", err=TypeError, fmt=dtype_name)
    offs = [m[_OFF] for m in allm]
    if any(o >= 0 for o in offs):  # explicit offsets: the ranges must not overlap
        if min(offs) < 0:
            raise ValueError("kv_offset: given on some ranks but not others; pass it on every rank or on none")
        spans = sorted((o, o + m[_L], r) for r, (o, m) in enumerate(zip(offs, allm)))
        for (a0, a1, ra), (b0, b1, rb) in zip(spans, spans[1:]):
            if b0 < a1 and b1 > b0 and a1 > a0:
                raise ValueError(f"kv_offset: rank {ra}'s tokens [{a0}, {a1}) overlap rank {rb}'s [{b0}, {b1})")


def _check_exchange(exchange_dtype, q_dtype) -> None:
    if exchange_dtype is not None and exchange_dtype not in (torch.float32, q_dtype):
        raise TypeError(f"exchange_dtype must be None, torch.float32 or q's dtype {q_dtype}, got {exchange_dtype}")


class Step(NamedTuple):
    """One rank's part of a context-parallel step: fill(out, lse) runs the local kernels; then gather_merge."""
    fill: Callable[[torch.Tensor, torch.Tensor], None]
    rows: Tuple[int, ...]
    D: int
    dtype: torch.dtype
    part_dtype: torch.dtype
    device: torch.device
    group: object
    rank: int
    world: int
    squeeze: bool


def context_parallel_decode(
    q: torch.Tensor,
    k_shard: torch.Tensor,
    v_shard: torch.Tensor,
    drop_mask: Optional[torch.Tensor] = None,
    kv_len: Union[None, int, torch.Tensor] = None,
    group=None,
    sm_scale: Optional[float] = None,
    kv_offset: Optional[int] = None,
    interleave: int = 0,
    validate: bool = True,
    exchange_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """masked_decode over a KV cache split along the sequence over the ranks of `group`; every rank gets the result
    of one pass over the whole cache.

    Args:
        q: [B, Hq, D] or [B, Hq, 1, D], the same on every rank (as masked_decode).
        k_shard, v_shard: [B, Hkv, L_r, D], this rank's part of the cache (L_r may differ between ranks, and be 0).
            Layout (interleave=0): rank r holds global tokens [offset_r, offset_r + L_r), offset_r = L_0 + ... +
            L_{r-1} (ranks in group order), unless kv_offset says otherwise. interleave=P > 0: global pages of P
            tokens are dealt round-robin, page p on rank p % world as that rank's local page p // world.
        drop_mask: optional bool [B, Hkv, L_r] for this rank's tokens (True drops), as masked_decode.
        kv_len: None (every token of every shard), or the GLOBAL valid length: an int, or an int32/int64 tensor [B]
            (the same values on every rank; read on the device). Each rank attends to its tokens below it: its
            local length clamp(kv_len - offset_r, 0, L_r) (contiguous) or its pages' share (interleave); a rank
            with none for a sequence contributes nothing to it.
        group: the process group (None: the default group). NCCL for CUDA tensors, gloo for CPU ones.
        sm_scale: logit scale, default D ** -0.5.
        kv_offset: this rank's first global token (contiguous layout), overriding the prefix sum of the L_r.
        interleave: 0 (contiguous ranges) or the page size P of the round-robin layout.
        validate: check once per (group, shapes) that every rank passes compatible arguments (one all-gather of
            12 int64 per rank and a host sync, on the first call only; later calls with the same shapes skip it).
            False skips it: then a contiguous layout with kv_len needs kv_offset (the offsets come from the check).
        exchange_dtype: the dtype of the partial outputs sent between ranks: None / torch.float32 (default; the
            merge then differs from one GPU only by the order of fp32 additions), or q's dtype (half the bytes; each
            part is rounded once more, within about one more ulp of q's dtype).
    Returns:
        (out in q's shape and dtype, lse [B, Hq] fp32), identical on every rank. A row no rank kept gets out 0,
        lse -inf. No host sync after the first call: CUDA-graph capturable (the collective included).
    """
    st = cp_decode_setup(q, k_shard, v_shard, drop_mask, kv_len, group, sm_scale, kv_offset, interleave, validate,
                         exchange_dtype)
    out, lse = gather_merge(st.fill, st.rows, st.D, st.dtype, st.part_dtype, st.device, st.group, st.rank, st.world)
    return (out.unsqueeze(2) if st.squeeze else out), lse


def cp_decode_setup(q, k_shard, v_shard, drop_mask=None, kv_len=None, group=None, sm_scale=None, kv_offset=None,
                    interleave=0, validate=True, exchange_dtype=None) -> Step:
    """context_parallel_decode's checks and local plan (the benchmark times fill and the exchange apart)."""
    group, rank, world = resolve_group(group)
    interleave = check_int("interleave", interleave, lo=0)
    if kv_offset is not None:
        kv_offset = check_int("kv_offset", kv_offset, lo=0)
        if interleave:
            raise ValueError("kv_offset applies to the contiguous layout only (interleave=0)")
    check_bool("validate", validate)
    args = {}

    def local_check():
        args["a"] = masked_prepare(q, k_shard, v_shard, drop_mask, None, sm_scale, names=("k_shard", "v_shard"))
        qq = args["a"][0]
        if isinstance(kv_len, torch.Tensor):
            check_tensor("kv_len", kv_len, dtypes=(torch.int32, torch.int64))
            if tuple(kv_len.shape) != (qq.shape[0],):
                raise ValueError(f"kv_len must have shape ({qq.shape[0]},) (one global length per sequence), "
                                 f"got {tuple(kv_len.shape)}")
            if kv_len.device != qq.device:
                raise ValueError(f"kv_len is on {kv_len.device} but q is on {qq.device}")
        elif kv_len is not None:
            check_int("kv_len", kv_len, lo=0)
        _check_exchange(exchange_dtype, qq.dtype)

    B, Hq, D = (q.shape[0], q.shape[1], q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() >= 3 else (0, 0, 0)
    kshape = tuple(k_shard.shape) if isinstance(k_shard, torch.Tensor) and k_shard.dim() == 4 else (0, 0, 0, 0)
    kind = 0 if kv_len is None else (2 if isinstance(kv_len, torch.Tensor) else 1)
    scale = sm_scale if isinstance(sm_scale, (int, float)) and not isinstance(sm_scale, bool) else D ** -0.5 if D else 0
    dt = dtype_code(q.dtype) if isinstance(q, torch.Tensor) else -1
    xdt = dtype_code(exchange_dtype) if isinstance(exchange_dtype, torch.dtype) else dtype_code(torch.float32)
    meta = [0, B, Hq, kshape[1], D, dt, kshape[2], float_bits(scale), kind, interleave,
            -1 if kv_offset is None else kv_offset, xdt]
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    sig = (device, B, Hq, kshape, dt, meta[_SCALE], kind, interleave, kv_offset, xdt)
    plan = checked_plan("context_parallel_decode", group, rank, world, device, sig, local_check, meta,
                        _compare_decode, validate)
    qq, k, v, drop, _, _, scale, squeeze = args["a"]
    L = k.shape[2]
    if kind and not interleave and kv_offset is None and world > 1:
        if plan is None:
            raise ValueError("kv_offset: with validate=False and a kv_len, pass this rank's first global token "
                             "(the offsets are otherwise learnt by the first validated call)")
        kv_offset = sum(m[_L] for m in plan["meta"][:rank])
    offset = kv_offset or 0
    if kind == 1 and plan is not None and meta[_OFF] < 0:
        total = sum(m[_L] for m in plan["meta"])
        if kv_len > total:
            raise ValueError(f"kv_len must be in [0, {total}] (the shards' total length), got {kv_len}")
    lens_t, len_int = None, L
    if kind == 1:
        len_int = _local_int(kv_len, offset, L, rank, world, interleave)
    elif kind == 2 and world == 1 and offset == 0 and kv_len.dtype == torch.int32:
        lens_t = kv_len.contiguous()  # masked_decode's case: its kernel clamps to [0, L]
    elif kind == 2:
        glob = kv_len.contiguous()

    def fill(out, lse):
        lens = lens_t
        if kind == 2 and lens is None:  # this rank's share of each global length, one small kernel
            lens = torch.empty(B, dtype=torch.int32, device=qq.device)
            _local_lens_kernel[(cdiv(B, 128),)](glob, lens, B, offset, L, rank, world, interleave,
                                                       INTERLEAVE=interleave > 0, BLOCK=128)
        masked_decode_fwd(qq, k, v, drop, lens, len_int, scale, out, lse)

    return Step(fill, (B, Hq), D, qq.dtype, exchange_dtype or torch.float32, qq.device, group, rank, world, squeeze)


def context_parallel_xl_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    u: Optional[torch.Tensor] = None,
    bd: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    group=None,
    validate: bool = True,
    validate_table: bool = False,
    exchange_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """xl_paged_decode over pages spread across the ranks of `group`; every rank gets (out, lse) of the whole
    context. Each rank passes its OWN pages: k_cache / v_cache its page pool, block_tables its pages of each
    sequence, context_lens [S] int32 how many of the sequence's tokens it holds (0 for none), and bd the
    positional term of those tokens in the same local order (bd[s, h, j] for local token j). Any split of a
    sequence's tokens over the ranks works (attention does not depend on the order of the keys). q and u are the
    same on every rank. validate, exchange_dtype: as context_parallel_decode; validate_table: xl_paged_decode's
    host check of this rank's table (syncs every call). Returns (out [S, H, D] in q's dtype, lse [S, H] fp32).
    """
    group, rank, world = resolve_group(group)
    check_bool("validate", validate)
    args = {}

    def local_check():
        args["scale"] = xl_prepare(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale,
                                   validate=validate_table)[0]
        _check_exchange(exchange_dtype, q.dtype)

    S, H, D = tuple(q.shape) if isinstance(q, torch.Tensor) and q.dim() == 3 else (0, 0, 0)
    dt = dtype_code(q.dtype) if isinstance(q, torch.Tensor) else -1
    sc = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) else D ** -0.5 if D else 0
    xdt = dtype_code(exchange_dtype) if isinstance(exchange_dtype, torch.dtype) else dtype_code(torch.float32)
    meta = [0, S, H, D, dt, float_bits(sc), u is not None, bd is not None, xdt]
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")

    def compare(allm):
        require_equal(allm, 1, "q", "S (sequences) =")
        require_equal(allm, 2, "q", "heads H =")
        require_equal(allm, 3, "q", "head dim D =")
        require_equal(allm, 4, "q", "dtype", err=TypeError, fmt=dtype_name)
        require_equal(allm, 5, "scale", "scale bits")
        require_equal(allm, 6, "u", "u given (1) or not (0):")
        require_equal(allm, 7, "bd", "bd given (1) or not (0):")
        require_equal(allm, 8, "exchange_dtype", "dtype", err=TypeError, fmt=dtype_name)

    kshape = tuple(k_cache.shape) if isinstance(k_cache, torch.Tensor) else None
    sig = (device, S, H, D, dt, meta[5], meta[6], meta[7], xdt, kshape)
    checked_plan("context_parallel_xl_paged_decode", group, rank, world, device, sig, local_check, meta, compare,
                 validate)
    lens = context_lens.contiguous()

    def fill(out, lse):
        xl_paged_decode_fwd(q, k_cache, v_cache, block_tables, lens, u, bd, args["scale"], out, lse)

    return gather_merge(fill, (S, H), D, q.dtype, exchange_dtype or torch.float32, q.device, group, rank, world)
