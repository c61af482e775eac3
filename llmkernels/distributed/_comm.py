"""Process groups, the once-per-shape metadata check across ranks, and the gather + log-sum-exp merge."""
import math
import struct
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .._runtime import capturing
from ..ops.combine.kernel import combine

# torch 2.13 renamed all_gather_into_tensor (kept, deprecated); the GPU machine's 2.11 has only the old name
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_DTYPE_CODES = (torch.float16, torch.bfloat16, torch.float32)
_CHECKED = {}  # (group, op, signature) -> {"lens": [...], "offsets": [...]}: validated on an earlier call


def resolve_group(group) -> Tuple[object, int, int]:
    """(group, rank in it, its size); ValueError / TypeError naming `group` when it cannot be used."""
    if not dist.is_available():
        raise ValueError("group: torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised; call torch.distributed.init_process_group "
                         "first (every rank), then pass group=None (the default group) or a group of it")
    if group is None:
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be None or a torch.distributed.ProcessGroup, got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return group, rank, dist.get_world_size(group)


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODES.index(dtype) if dtype in _DTYPE_CODES else -1


def dtype_name(code: int) -> str:
    return str(_DTYPE_CODES[code]).replace("torch.", "") if 0 <= code < len(_DTYPE_CODES) else "other"


def float_bits(x: float) -> int:
    """A float as an int64 (exact equality across ranks through an integer collective)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _meta_device(group, device: torch.device) -> torch.device:
    """Where the metadata tensor lives: the data's device, except that gloo takes CPU tensors."""
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:  # a backend-less group object: use the data's device
        backend = ""
    return torch.device("cpu") if backend == "gloo" else device


def gather_meta(group, world: int, device: torch.device, meta: Sequence[int]) -> List[List[int]]:
    """Every rank's int metadata vector (one all-gather of len(meta) int64 per rank, then a host sync)."""
    mine = torch.tensor(list(meta), dtype=torch.int64, device=_meta_device(group, device))
    allm = torch.empty(world * mine.numel(), dtype=torch.int64, device=mine.device)
    _all_gather(allm, mine, group=group)
    return allm.view(world, -1).tolist()


def checked_plan(op: str, group, rank: int, world: int, device: torch.device, signature: tuple,
                 local_check: Callable[[], None], meta: Sequence[int],
                 compare: Callable[[List[List[int]]], None], validate: bool) -> Optional[dict]:
    """The cross-rank check of one call signature: run once per (group, op, signature) when validate is True.

    local_check() runs this rank's argument checks. With validate, its error is held back until every rank has
    exchanged its metadata (meta[0] is replaced by the error flag), so that a bad argument on one rank raises on
    every rank instead of leaving the others waiting in the collective; compare(all_meta) raises on a mismatch.
    Returns the plan {"lens": [L of each rank]} (cached), or None when validate is False and no plan is cached.
    """
    key = (group, op, signature)
    plan = _CHECKED.get(key)
    if plan is not None or not validate:
        local_check()
        return plan
    if world == 1:  # nothing to compare: no collective
        local_check()
        plan = _CHECKED[key] = {"meta": [list(meta)]}
        return plan
    if capturing(device):
        raise RuntimeError(f"{op}: the first call with these shapes checks the shards of every rank (a small "
                           f"all-gather and a host sync), which cannot run inside CUDA-graph capture; call it once "
                           f"before capturing (the usual warm-up) or pass validate=False")
    err = None
    try:
        local_check()
    except (TypeError, ValueError) as e:
        err = e
    allm = gather_meta(group, world, device, [1 if err is not None else 0] + list(meta[1:]))
    if err is not None:
        raise err
    bad = [r for r, m in enumerate(allm) if m[0]]
    if bad:
        raise RuntimeError(f"{op}: rank {bad[0]} rejected its arguments (its error says which); every rank stops")
    compare(allm)
    plan = {"meta": allm}
    _CHECKED[key] = plan
    return plan


def require_equal(allm: List[List[int]], index: int, arg: str, what: str, err=ValueError, fmt=str) -> None:
    """Raise `err` naming `arg` unless every rank sent the same value at position index."""
    for r, m in enumerate(allm):
        if m[index] != allm[0][index]:
            raise err(f"{arg}: rank {r} has {what} {fmt(m[index])} but rank 0 has {fmt(allm[0][index])}; every "
                      f"rank of the group must pass the same")


def exchange_buffer(world: int, R: int, D: int, part_dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The bytes [world, R * D * size + R * 4] of every rank's part: its out rows (part_dtype), then its lse (fp32)."""
    return torch.empty(world, R * D * part_dtype.itemsize + R * 4, dtype=torch.uint8, device=device)


def part_views(buf: torch.Tensor, R: int, D: int, part_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(outs [world, R, D] in part_dtype, lses [world, R] fp32) viewing an exchange_buffer (D even: 4-byte lse)."""
    nb = R * D * part_dtype.itemsize
    return buf[:, :nb].view(part_dtype).view(buf.shape[0], R, D), buf[:, nb:].view(torch.float32)


def gather_merge(fill: Callable[[torch.Tensor, torch.Tensor], None], rows_shape: Tuple[int, ...], D: int,
                 out_dtype: torch.dtype, part_dtype: torch.dtype, device: torch.device, group, rank: int, world: int
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fill(out, lse) computes this rank's part; returns the merge of every rank's part, the same on every rank.

    World 1: fill writes the result directly. Otherwise the part goes, in part_dtype (out) and fp32 (lse), straight
    into this rank's slot of one byte buffer (exchange_buffer), one in-place all-gather fills the other slots, and
    the library's log-sum-exp combine merges the world parts of each row in rank order (so every rank gets the same
    bits). fp32 parts make the merge one more level of the split-KV merge the kernels already do in fp32.
    """
    R = math.prod(rows_shape)
    if world == 1:
        out = torch.empty(rows_shape + (D,), dtype=out_dtype, device=device)
        lse = torch.empty(rows_shape, dtype=torch.float32, device=device)
        fill(out, lse)
        return out, lse
    buf = exchange_buffer(world, R, D, part_dtype, device)
    outs, lses = part_views(buf, R, D, part_dtype)
    fill(outs[rank].view(rows_shape + (D,)), lses[rank].view(rows_shape))
    return exchange_merge(buf, rank, rows_shape, D, out_dtype, part_dtype, group)


def exchange_merge(buf: torch.Tensor, rank: int, rows_shape: Tuple[int, ...], D: int, out_dtype: torch.dtype,
                   part_dtype: torch.dtype, group) -> Tuple[torch.Tensor, torch.Tensor]:
    """The collective and the merge of gather_merge on a filled slot buf[rank] (benchmarked on its own)."""
    R = math.prod(rows_shape)
    _all_gather(buf.view(-1), buf[rank], group=group)  # in place: NCCL skips the copy of this rank's slot
    out = torch.empty(rows_shape + (D,), dtype=out_dtype, device=buf.device)
    lse = torch.empty(rows_shape, dtype=torch.float32, device=buf.device)
    if R:
        outs, lses = part_views(buf, R, D, part_dtype)
        combine(outs.transpose(0, 1), lses.transpose(0, 1), out.view(R, D), lse.view(R))
    return out, lse
