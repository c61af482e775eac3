"""Log-sum-exp merge of split attention results; shared by every split-KV op."""

import torch
import triton
import triton.language as tl

from ..._constants import LOG2E_C
from ..._launch import Launch, launch
from ..._pdl import pdl_enabled, pdl_enter
from ..._runtime import capturing, next_pow2

@triton.jit
def softmax_step(s, m_i, l_i, AXIS: tl.constexpr):
    """One online-softmax step of the split-KV kernels over logits s already scaled to log2 units and masked with
    -inf: (p = exp2(s - m_new), alpha = exp2(m_i - m_new) for the running sums, m_new, l_i updated). The keys run
    along AXIS: 1 for s [rows, keys], 0 for s [keys]. A row with nothing attended yet keeps m = -inf and l = 0
    (exp2 of -inf - 0, never inf - inf)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=AXIS))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if AXIS == 1:
        p = tl.exp2(s - m_safe[:, None])
    else:
        p = tl.exp2(s - m_safe)
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=AXIS)


@triton.jit
def _lse2(ptr, mask):
    """Parts' lse (any float dtype) as log2; +inf (sparse_mla's row with no valid index) is a part with no key."""
    ls = tl.load(ptr, mask=mask, other=float("-inf")).to(tl.float32)
    return tl.where(ls == float("inf"), float("-inf"), ls) * LOG2E_C


@triton.jit
def merge_row(
    o_ptr, lse_ptr, out_ptr, lse_out_ptr, row, S, D,
    stride_os, stride_or, stride_ls, stride_lr, stride_out_r,
    HAS_LSE_OUT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ONE_SHOT: tl.constexpr, d0=0,
):
    """Merge the S partial (out, lse) of one row; rows whose parts are all -inf get out 0, lse -inf; a NaN lse
    makes the row NaN (out and lse). ONE_SHOT with d0: only columns d0 .. d0 + BLOCK_D - 1 (a slice of a wide row;
    the slice at d0 = 0 stores the lse)."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    if ONE_SHOT:  # S <= BLOCK_S and D <= d0 + BLOCK_D: lse and out of every part in one round trip to memory
        offs_d += d0
        smask = offs_s < S
        dmask = offs_d < D
        ls = _lse2(lse_ptr + row * stride_lr + offs_s * stride_ls, smask)
        o = tl.load(o_ptr + row * stride_or + offs_s[:, None] * stride_os + offs_d[None, :],
                    mask=smask[:, None] & dmask[None, :], other=0.0)
        m_all = tl.max(ls, axis=0)
        m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
        w = tl.exp2(ls - m_safe)
        total = tl.sum(w, axis=0)
        inv = tl.where(total == 0, 0.0, 1.0 / total)  # NaN total (a NaN part) stays NaN
        o = tl.where((w > 0)[:, None], o.to(tl.float32), 0.0)  # a part with zero weight may hold anything
        tl.store(out_ptr + row * stride_out_r + offs_d, (tl.sum(o * w[:, None], axis=0) * inv).to(
            out_ptr.dtype.element_ty), mask=dmask)
    else:
        # pass 1: max and sum of exp over all splits (base 2)
        m = tl.full([BLOCK_S], float("-inf"), tl.float32)
        for s0 in range(0, S, BLOCK_S):
            m = tl.maximum(m, _lse2(lse_ptr + row * stride_lr + (s0 + offs_s) * stride_ls, s0 + offs_s < S))
        m_all = tl.max(m, axis=0)
        m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
        denom = tl.zeros([BLOCK_S], tl.float32)
        for s0 in range(0, S, BLOCK_S):
            denom += tl.exp2(_lse2(lse_ptr + row * stride_lr + (s0 + offs_s) * stride_ls, s0 + offs_s < S) - m_safe)
        total = tl.sum(denom, axis=0)
        inv = tl.where(total == 0, 0.0, 1.0 / total)
        for d0 in range(0, D, BLOCK_D):
            dmask = d0 + offs_d < D
            acc = tl.zeros([BLOCK_D], tl.float32)
            for s0 in range(0, S, BLOCK_S):
                smask = s0 + offs_s < S
                w = tl.exp2(_lse2(lse_ptr + row * stride_lr + (s0 + offs_s) * stride_ls, smask) - m_safe)
                # skip loading parts with zero weight: an empty split may hold no finite partial output
                o = tl.load(o_ptr + row * stride_or + (s0 + offs_s)[:, None] * stride_os + (d0 + offs_d)[None, :],
                            mask=smask[:, None] & dmask[None, :] & (w > 0)[:, None], other=0.0)
                acc += tl.sum(o.to(tl.float32) * w[:, None], axis=0)
            tl.store(out_ptr + row * stride_out_r + d0 + offs_d, (acc * inv).to(out_ptr.dtype.element_ty),
                     mask=dmask)
    if HAS_LSE_OUT:
        lse = tl.where(total == 0, float("-inf"), (m_safe + tl.log2(total)) / LOG2E_C)
        tl.store(lse_out_ptr + row, lse, mask=d0 == 0)


@triton.jit
def merge_if_last(cnt_ptr, grp, o_ptr, lse_ptr, out_ptr, lse_out_ptr, row0, S, D, stride_os, stride_or, stride_lr,
                  ROWS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ONE_SHOT: tl.constexpr,
                  arrivals=None):
    """Epilogue of a split program that stored its part of rows row0 .. row0 + ROWS - 1 (o_part [R, S, D] fp32 with
    unit last stride, lse_part [R, S] with unit split stride, out rows of D): the last of the rows' `arrivals`
    programs (S unless given) to arrive at counter grp merges their S parts (merge_row, lse out too) and re-arms the
    counter (0) for the next launch. Saves the merge's launch; the counters start at 0 (SplitParts)."""
    if arrivals is None:
        arrivals = S
    tl.debug_barrier()  # every thread's part stores precede the release below
    if tl.atomic_add(cnt_ptr + grp, 1, sem="acq_rel") == arrivals - 1:  # acquire: the others' parts are visible
        for g in tl.static_range(ROWS):
            merge_row(o_ptr, lse_ptr, out_ptr, lse_out_ptr, row0 + g, S, D, stride_os, stride_or, 1, stride_lr, D,
                      True, BLOCK_S, BLOCK_D, ONE_SHOT)
        tl.store(cnt_ptr + grp, 0)


@triton.jit
def _combine_kernel(
    o_ptr, lse_ptr, out_ptr, lse_out_ptr,
    S, D,
    stride_os, stride_or, stride_ls, stride_lr, stride_out_r,
    HAS_LSE_OUT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ONE_SHOT: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    pdl_enter(USE_GDC)  # launched early: wait until the split kernel's writes land, then release the next kernel
    merge_row(o_ptr, lse_ptr, out_ptr, lse_out_ptr, tl.program_id(0).to(tl.int64), S, D,
              stride_os, stride_or, stride_ls, stride_lr, stride_out_r, HAS_LSE_OUT, BLOCK_S, BLOCK_D, ONE_SHOT,
              tl.program_id(1) * BLOCK_D)  # (one program a row unless ONE_SHOT slices D: combine_blocks)


@triton.jit
def _merge2_kernel(oa_ptr, ob_ptr, la_ptr, lb_ptr, out_ptr, lse_out_ptr, D, BLOCK_D: tl.constexpr):
    """merge_row for two parts given as two contiguous [R, D] tensors (no stacking on the host); same arithmetic."""
    row = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    la = tl.load(la_ptr + row).to(tl.float32)
    lb = tl.load(lb_ptr + row).to(tl.float32)
    la = tl.where(la == float("inf"), float("-inf"), la) * LOG2E_C  # as _lse2: +inf is a part with no key
    lb = tl.where(lb == float("inf"), float("-inf"), lb) * LOG2E_C
    m_all = tl.maximum(la, lb)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    wa = tl.exp2(la - m_safe)
    wb = tl.exp2(lb - m_safe)
    total = wa + wb
    inv = tl.where(total == 0, 0.0, 1.0 / total)  # NaN total (a NaN part) stays NaN
    oa = tl.where(wa > 0, tl.load(oa_ptr + row * D + offs_d, mask=dmask, other=0.0).to(tl.float32), 0.0)
    ob = tl.where(wb > 0, tl.load(ob_ptr + row * D + offs_d, mask=dmask, other=0.0).to(tl.float32), 0.0)
    tl.store(out_ptr + row * D + offs_d, ((oa * wa + ob * wb) * inv).to(out_ptr.dtype.element_ty), mask=dmask)
    tl.store(lse_out_ptr + row, tl.where(total == 0, float("-inf"), (m_safe + tl.log2(total)) / LOG2E_C))


class Merge2Plan:
    """Two contiguous parts [..., D] with contiguous lses [...]: one launch over the rows, no stacking."""

    def __init__(self, R: int, D: int):
        self.R, self.D = R, D
        self.launch = Launch(_merge2_kernel, (R,), BLOCK_D=next_pow2(D), num_warps=4 if D > 512 else 1)

    def __call__(self, oa, ob, la, lb, out, lse_out) -> None:
        if self.R:
            self.launch(oa, ob, la, lb, out, lse_out, self.D)


MERGE_TILE = 8192  # fp32 elements of a merge program's [parts, D] tile: 64 registers a thread at 4 warps
# up to this many parts merge at once in slices of D, a program each (row, slice): 3-6x faster than looping (H200)
SLICE_PARTS = 512


def combine_blocks(S: int, D: int, slices: bool = True):
    """(BLOCK_S, BLOCK_D, ONE_SHOT) for merging S parts of width D: all parts at once while the [S, D] fp32 tile
    stays within MERGE_TILE; with slices (a merge launch, not a split kernel's own merge) and S <= SLICE_PARTS, all
    parts at once over D slices of MERGE_TILE / S (>= 16) columns, a program each; else 16 parts at a time."""
    s_all, d_all = next_pow2(max(S, 1)), next_pow2(D)
    if s_all * d_all <= MERGE_TILE:
        return s_all, d_all, True
    if slices and S <= SLICE_PARTS and MERGE_TILE // s_all >= 16:
        return s_all, MERGE_TILE // s_all, True
    return min(s_all, 16), min(d_all, 256), False


class CombinePlan:
    """The merge launch for R rows of S parts of width D; strides (part, row of o_part; part, row of lse_part; row of
    out) fixed. Called with the tensors: o_part, lse_part, out, lse_out (None when has_lse_out is False)."""

    def __init__(self, R: int, S: int, D: int, strides: tuple, has_lse_out: bool, device: torch.device):
        self.empty, self.ints = R == 0, (S, D, *strides)
        grid, consts = _launch_shape(R, S, D, has_lse_out, device)
        self.launch = Launch(_combine_kernel, grid, **consts)

    def __call__(self, o_part, lse_part, out, lse_out) -> None:
        if not self.empty:
            self.launch(o_part, lse_part, out, lse_out if lse_out is not None else lse_part, *self.ints)


_SCRATCH = {}  # (device index, raw stream) -> (parts fp32, counters int32, their addresses): see split_scratch


def split_scratch(device: torch.device, numel: int, counters: int) -> tuple:
    """(parts, counters, parts' address, counters' address): fp32 scratch of >= numel elements and >= `counters`
    int32 arrival counters, all 0, for the split kernels of eager calls (merge_if_last re-arms each counter it uses,
    so they are 0 again when a kernel ends; row_topk's counts leave them 0 too). One pair per (device, stream),
    shared by every plan: the calls on a stream run in order, and no allocation or zeroing is left per call. Not for
    CUDA-graph capture (see SplitParts)."""
    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index)) if device.type == "cuda" else None
    e = _SCRATCH.get(key)
    if e is None or e[0].numel() < numel or e[1].numel() < counters:
        parts = torch.empty(max(numel, e[0].numel() if e else 0), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(counters, e[1].numel() if e else 0, 1), dtype=torch.int32, device=device)
        e = _SCRATCH[key] = parts, cnt, parts.data_ptr(), cnt.data_ptr()
    return e


def empty_cache() -> None:
    """Free the scratch that eager calls keep per (device, stream) for split parts (masked_decode, xl_paged_decode,
    the sparse MLA forward) and row_topk's counts; it grows to the largest call's parts, a few MB at typical shapes.
    The next eager call allocates it again; torch.cuda.empty_cache() then returns the memory to the driver."""
    _SCRATCH.clear()


class SplitParts:
    """Where a split kernel's R rows x S parts of width D go and how they are merged. S == 1: nowhere, the split
    kernel writes out and lse itself (direct_write). Eager calls with fuse: the split kernel merges them itself
    (merge_if_last, one arrival counter per group of rows), parts in split_scratch. Otherwise (fuse False, or
    CUDA-graph capture, whose graph may be replayed beside other work on another stream) a CombinePlan launch merges
    them: parts in split_scratch when eager, a fresh buffer under capture."""

    def __init__(self, R: int, S: int, D: int, groups: int, fuse: bool, device: torch.device):
        self.direct_write, self.groups = S == 1, groups if fuse and S > 1 else 0
        self.numel, self.lse_numel = R * S * D, R * S
        self.merge = CombinePlan(R, S, D, (D, S * D, 1, S, D), True, device) if S > 1 else None
        self.blocks = combine_blocks(S, D, slices=False)  # (a split kernel's own merge takes whole rows)
        # the split kernel's part strides (row of o_part, split of o_part, row of lse_part); with one split, out's
        self.strides = (D, D, 1) if S == 1 else (S * D, D, S)

    def fused(self, device: torch.device) -> bool:
        """This call's split kernel merges its parts (see the class)."""
        return self.groups > 0 and not capturing(device)

    def launches(self, kernel, grid: tuple, consts: dict) -> tuple:
        """(split, fused): the split kernel's launch, and its merging variant (None where it never merges). A kernel
        with no merge after it does not release its dependents at entry (see pdl_enter)."""
        split = Launch(kernel, grid, **consts, TRIGGER=not self.direct_write)
        fused = Launch(kernel, grid, **consts, FUSED=True, TRIGGER=False,
                       **dict(zip(("MB_S", "MB_D", "MB_ONE"), self.blocks))) if self.groups else None
        return split, fused

    def pick(self, split: Launch, fused: Launch, device: torch.device) -> tuple:
        """(the launch for this call, whether it merges): `fused`, the split kernel's merging variant, or `split`."""
        f = self.fused(device)
        return (fused if f else split), f

    def launch(self, go: Launch, fused: bool, args: tuple, ints: tuple, out, lse, dummy, extra: tuple = ()) -> None:
        """go(*args, o_part, lse_part, counters, out, lse, *ints, *extra) as the mode needs (pick: go and fused), and
        the merge launch where go does not merge; `dummy` stands for the pointers a mode does not use."""
        if self.direct_write:  # one split: its part is the result
            go(*args, out, lse, dummy, dummy, dummy, *ints, *extra)
            return
        o_part, lse_part, cnt = self.get(out.device, fused, go.direct() and (fused or self.merge.launch.direct()))
        if fused:
            go(*args, o_part, lse_part, cnt, out, lse, *ints, *extra)
        else:
            go(*args, o_part, lse_part, dummy, dummy, dummy, *ints, *extra)
            self.merge(o_part, lse_part, out, lse)

    def get(self, device: torch.device, fused: bool, addresses: bool) -> tuple:
        """(o_part, lse_part, counters (fused only, else None)): addresses for kept kernels (which read only those),
        else typed views."""
        n = self.numel + self.lse_numel
        if capturing(device):  # (never fused there: see fused)
            parts = torch.empty(n, dtype=torch.float32, device=device)
            return parts[:self.numel], parts[self.numel:], None
        parts, cnt, pa, ca = split_scratch(device, n, self.groups if fused else 0)
        if addresses:
            return pa, pa + 4 * self.numel, ca if fused else None
        return parts[:self.numel], parts[self.numel:n], cnt if fused else None


def combine(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, lse_out) -> None:
    """Merge S partial results per row.

    On Hopper the merge is launched with programmatic dependent launch, so its launch overlaps the tail of
    the split kernel that produced the parts (which may call tl.extra.cuda.gdc_launch_dependents()).

    o_part [R, S, D] or any 3-d view indexed (row, split, d) with unit last stride;
    lse_part [R, S] natural log; out [R, D] with unit last stride; lse_out [R] fp32 contiguous or None.
    """
    R, S, D = o_part.shape
    if R:  # keyed launch (_launch.launch): repeated calls with like arguments skip Triton's binding
        grid, consts = _launch_shape(R, S, D, lse_out is not None, o_part.device)
        launch(_combine_kernel, grid, o_part, lse_part, out, lse_out if lse_out is not None else lse_part,
               S, D, o_part.stride(1), o_part.stride(0), lse_part.stride(1), lse_part.stride(0), out.stride(0),
               **consts)


def _launch_shape(R: int, S: int, D: int, has_lse_out: bool, device: torch.device) -> tuple:
    """(grid, constexprs) of the merge launch: a row a program, or (row, D slice) where the merge takes all parts
    at once in slices of D (combine_blocks)."""
    BLOCK_S, BLOCK_D, one_shot = combine_blocks(S, D)
    pdl = pdl_enabled(device)
    return (R, triton.cdiv(D, BLOCK_D) if one_shot else 1), dict(
        HAS_LSE_OUT=has_lse_out, BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D, ONE_SHOT=one_shot, USE_GDC=pdl, num_warps=4,
        **({"launch_pdl": True} if pdl else {}))
