"""NVFP4 GEMV for Hopper: E2M1 decoded in registers, fp32 accumulation (the weight-only linear: linear.py).

GEMV (fp4 x fp4): one int64 = one 16-value scale block. Twice an E2M1 value is an integer in [-12, 12], so a
block's dot product sum (2a)(2b) is an exact int32, computed with byte lookups (prmt) and 4-way integer dot
products (dp4a); it is scaled by sfa * sfb / 4 in fp32 (exact: at most 16 significant bits) and accumulated in
fp32 across blocks. Under the Triton interpreter the same sums come from plain integer arithmetic.
"""
import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._launch import Launch, keyed
from ..._runtime import cdiv, interpreting, next_pow2, num_sms
from ..._pdl import pdl_enabled
from .common import ASM_A, ASM_A_IMM, ASM_B, ASM_B_IMM, _nvfp4_splitk_reduce_kernel, e4m3_f32
from .format import u8


@triton.jit
def _e2m1_x2(c):
    """int32 codes 0..15 -> 2 * E2M1 value, an int32 in [-12, 12]."""
    mag = c & 7
    m = mag & 1
    e = mag >> 1
    v = tl.where(e == 0, m, (2 + m) << tl.maximum(e - 1, 0))
    return tl.where(c >= 8, -v, v)


@triton.jit
def _block_dot(a, b, USE_ASM: tl.constexpr, LUT_REG: tl.constexpr):
    """a [BM, BB] int64 blocks, b [1, BB] int64 blocks -> int32 [BM, BB] = sum over each block of (2a)(2b).
    LUT_REG: the table word in a register (_LUT) rather than an immediate (_LUT_IMM); see gemv_plan."""
    if USE_ASM:
        b0, b1, b2, b3, n0, n1, n2, n3 = tl.inline_asm_elementwise(
            ASM_B if LUT_REG else ASM_B_IMM, "=r,=r,=r,=r,=r,=r,=r,=r,l", [b],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32, tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        acc = tl.inline_asm_elementwise(
            ASM_A if LUT_REG else ASM_A_IMM, "=r,l,r,r,r,r,r,r,r,r",
            [a, b0, b1, b2, b3, n0, n1, n2, n3], dtype=tl.int32, is_pure=True, pack=1)
    else:
        acc = tl.zeros(a.shape, tl.int32)
        for j in tl.static_range(16):
            ca = ((a >> (4 * j)) & 15).to(tl.int32)
            cb = ((b >> (4 * j)) & 15).to(tl.int32)
            acc += _e2m1_x2(ca) * _e2m1_x2(cb)
    return acc


@triton.jit
def _tile_term(a, sa, b, sb, USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr, LUT_REG: tl.constexpr):
    dot = _block_dot(a, b, USE_ASM, LUT_REG)
    scale = e4m3_f32(sa, FIX_NAN) * (e4m3_f32(sb, FIX_NAN) * 0.25)
    return dot.to(tl.float32) * scale


@triton.jit
def _gdc_wait(EMIT: tl.constexpr):
    if EMIT:  # griddepcontrol.* is inline PTX: absent under the interpreter (the code order is still tested)
        tl.extra.cuda.gdc_wait()


@triton.jit
def _gdc_trigger(EMIT: tl.constexpr):
    if EMIT:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _load_weights(a_rows, sa_rows, row_ok, k0, k_hi, s_sak, BB: tl.constexpr, EVEN: tl.constexpr):
    """a and sfa of one tile (weights: with static_weights, read before griddepcontrol.wait). EVEN: every row and
    block of the tile exists (no masks: no predicates, no zero-fill of the destination registers)."""
    kk = k0 + tl.arange(0, BB)
    # scales: claim only 2-wide contiguity so they take the layout of a (2 blocks = 16 bytes per thread)
    if EVEN:
        a = tl.load(a_rows + kk[None, :])
        sa = tl.load(sa_rows + tl.max_contiguous(kk, 2)[None, :] * s_sak)
    else:
        m2 = row_ok[:, None] & (kk < k_hi)[None, :]
        a = tl.load(a_rows + kk[None, :], mask=m2, other=0)
        sa = tl.load(sa_rows + tl.max_contiguous(kk, 2)[None, :] * s_sak, mask=m2, other=0)
    return a, sa


@triton.jit
def _load_act(b_row, sb_row, k0, k_hi, s_sbk, BB: tl.constexpr, EVEN: tl.constexpr):
    """b and sfb of one tile (activations: possibly written by the preceding kernel). The b row is loaded as
    [1, BB] in the layout of a (1-D loads get their own layout: shared-memory shuffles)."""
    kk = k0 + tl.arange(0, BB)
    if EVEN:
        b = tl.load(b_row + kk[None, :])
        sb = tl.load(sb_row + tl.max_contiguous(kk, 2)[None, :] * s_sbk)
    else:
        k_ok = kk < k_hi
        b = tl.load(b_row + kk[None, :], mask=k_ok[None, :], other=0)
        sb = tl.load(sb_row + tl.max_contiguous(kk, 2)[None, :] * s_sbk, mask=k_ok[None, :], other=0)
    return b, sb


@triton.jit
def _prefetch_l2(ptrs, ok):
    """Fire-and-forget prefetch of the lines at ptrs into L2: no registers held, nothing waits on it. Safe before
    griddepcontrol.wait: L2 is the point of coherence, so a later write by the preceding kernel updates the line
    and the loads after the wait see it (they were never cached in L1). GPU only (inline PTX)."""
    tl.inline_asm_elementwise("{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\n@p prefetch.global.L2 [$1];\nmov.u32 $0, 0;\n}",
                              "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_act(b_row, sb_row, k_lo, k_hi, s_sbk, BB: tl.constexpr):
    """L2 prefetch of b and sfb over [k_lo, k_hi): one address per 16 blocks (128 bytes of b)."""
    for k0 in range(k_lo, k_hi, BB):
        kk = k0 + tl.arange(0, BB // 16) * 16
        _prefetch_l2(b_row + kk, kk < k_hi)
        _prefetch_l2(sb_row + kk * s_sbk, kk < k_hi)


@triton.jit
def _load_tile(a_rows, sa_rows, b_row, sb_row, row_ok, k0, k_hi, s_sak, s_sbk, BB: tl.constexpr, EVEN: tl.constexpr):
    a, sa = _load_weights(a_rows, sa_rows, row_ok, k0, k_hi, s_sak, BB, EVEN)
    b, sb = _load_act(b_row, sb_row, k0, k_hi, s_sbk, BB, EVEN)
    return a, sa, b, sb


@triton.jit
def _trigger_if_last(k0, k_hi, BB: tl.constexpr, TRIGGER: tl.constexpr, EMIT: tl.constexpr):
    if TRIGGER == 2:  # after the program's last load is issued (one thread per CTA suffices; repeats are no-ops)
        if k0 + BB >= k_hi:
            _gdc_trigger(EMIT)


@triton.jit
def _row_tile(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, part_ptr, alpha, pid_m, l, split,
              M, L, KB, per_split,
              s_al, s_am, s_sam, s_sak, s_sal, s_bl, s_sbk, s_sbl, s_om, s_ol,
              BM: tl.constexpr, BB: tl.constexpr, PARTIAL: tl.constexpr, PREFETCH: tl.constexpr,
              USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr, USE_GDC: tl.constexpr, PRE: tl.constexpr,
              TRIGGER: tl.constexpr, EMIT: tl.constexpr, L2: tl.constexpr, EVEN: tl.constexpr,
              LUT_REG: tl.constexpr):
    """Output rows pid_m*BM.. of batch l over the K range of `split`.

    L2 (with USE_GDC, GPU only): before griddepcontrol.wait, the first row tile of each batch prefetches b and sfb
    of the program's K range into L2 (every program prefetching the same lines serialises on their L2 slice;
    prefetching the weights into L2 instead of registers lost 7-13 points: notes, round 10)."""
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < M
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, KB)
    a_rows = a_ptr + l * s_al + rows[:, None].to(tl.int64) * s_am
    sa_rows = sa_ptr + l * s_sal + rows[:, None].to(tl.int64) * s_sam
    b_row = b_ptr + l * s_bl
    sb_row = sb_ptr + l * s_sbl
    acc = tl.zeros([BM, BB], tl.float32)  # per-thread partials; one cross-thread reduction at the end
    k_start = k_lo
    if USE_GDC:
        # programmatic dependent launch: the preceding kernel may still run. The first PRE tiles of the
        # weights (a, sfa) are loaded before the wait; b, sfb, the stores (and partials) only after it.
        # The tiles are summed in the same order as below (bit-identical results).
        if PRE >= 1:
            a0, sa0 = _load_weights(a_rows, sa_rows, row_ok, k_lo, k_hi, s_sak, BB, EVEN)
        if PRE >= 2:
            a1, sa1 = _load_weights(a_rows, sa_rows, row_ok, k_lo + BB, k_hi, s_sak, BB, EVEN)
        if L2:
            if pid_m == 0:
                _prefetch_act(b_row, sb_row, k_lo, k_hi, s_sbk, BB)
        _gdc_wait(EMIT)
        if TRIGGER == 1:  # once the preceding kernel is done: the next one may start
            _gdc_trigger(EMIT)
        if PRE >= 1:
            b0, sb0 = _load_act(b_row, sb_row, k_lo, k_hi, s_sbk, BB, EVEN)
            if PRE >= 2:
                b1, sb1 = _load_act(b_row, sb_row, k_lo + BB, k_hi, s_sbk, BB, EVEN)
                _trigger_if_last(k_lo + BB, k_hi, BB, TRIGGER, EMIT)
            else:
                _trigger_if_last(k_lo, k_hi, BB, TRIGGER, EMIT)
            k_start = k_lo + PRE * BB
            if PREFETCH:  # the next tile's loads in flight while the preloaded tiles decode
                a, sa, b, sb = _load_tile(a_rows, sa_rows, b_row, sb_row, row_ok, k_start, k_hi, s_sak, s_sbk, BB, EVEN)
            acc += _tile_term(a0, sa0, b0, sb0, USE_ASM, FIX_NAN, LUT_REG)
            if PRE >= 2:
                acc += _tile_term(a1, sa1, b1, sb1, USE_ASM, FIX_NAN, LUT_REG)
    if PREFETCH:  # issue tile i+1's loads before decoding tile i (masked past the end: no traffic)
        if not (USE_GDC and PRE >= 1):
            a, sa, b, sb = _load_tile(a_rows, sa_rows, b_row, sb_row, row_ok, k_start, k_hi, s_sak, s_sbk, BB, EVEN)
        for k0 in range(k_start, k_hi, BB):
            a2, sa2, b2, sb2 = _load_tile(a_rows, sa_rows, b_row, sb_row, row_ok, k0 + BB, k_hi, s_sak, s_sbk, BB, EVEN)
            if USE_GDC:
                _trigger_if_last(k0 + BB, k_hi, BB, TRIGGER, EMIT)
            acc += _tile_term(a, sa, b, sb, USE_ASM, FIX_NAN, LUT_REG)
            a, sa, b, sb = a2, sa2, b2, sb2
    else:
        for k0 in range(k_start, k_hi, BB):
            a, sa, b, sb = _load_tile(a_rows, sa_rows, b_row, sb_row, row_ok, k0, k_hi, s_sak, s_sbk, BB, EVEN)
            if USE_GDC:
                _trigger_if_last(k0, k_hi, BB, TRIGGER, EMIT)
            acc += _tile_term(a, sa, b, sb, USE_ASM, FIX_NAN, LUT_REG)
    total = tl.sum(acc, axis=1)
    if PARTIAL:  # split K: fp32 partial sums, reduced in a fixed order by _nvfp4_splitk_reduce_kernel
        tl.store(part_ptr + (split * L + l) * M + rows, total, mask=row_ok)
    else:
        tl.store(out_ptr + l * s_ol + rows * s_om, (total * alpha).to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _gemv_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, part_ptr, alpha,
                 M, L, KB, per_split, n_mtiles,
                 s_al, s_am, s_sam, s_sak, s_sal, s_bl, s_sbk, s_sbl, s_om, s_ol,
                 BM: tl.constexpr, BB: tl.constexpr, PARTIAL: tl.constexpr, PREFETCH: tl.constexpr,
                 USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr, USE_GDC: tl.constexpr, PRE: tl.constexpr,
                 TRIGGER: tl.constexpr, PERSISTENT: tl.constexpr, EMIT: tl.constexpr, L2: tl.constexpr = False,
                 EVEN: tl.constexpr = False, LUT_REG: tl.constexpr = True):
    """USE_GDC (launched with programmatic dependent launch): TRIGGER 0 = no explicit trigger (the next
    kernel may start when this grid's programs have exited), 1 = right after griddepcontrol.wait, 2 = after
    the program's last load is issued, 3 = at entry. PERSISTENT: grid (P, 1, 1), program p handles the row
    tiles p, p + P, ... (split 1 only)."""
    if USE_GDC:
        if TRIGGER == 3:
            _gdc_trigger(EMIT)
    if PERSISTENT:
        for t in range(tl.program_id(0), n_mtiles * L, tl.num_programs(0)):
            _row_tile(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, part_ptr, alpha, t % n_mtiles,
                      (t // n_mtiles).to(tl.int64),
                      # split 0 as a runtime value: with a constant 0 the K offsets look fully contiguous and
                      # the weight loads get a wider layout than the math (shared-memory shuffles)
                      tl.program_id(2), M, L, KB, per_split, s_al, s_am, s_sam, s_sak, s_sal, s_bl, s_sbk, s_sbl,
                      s_om, s_ol, BM, BB, PARTIAL, PREFETCH, USE_ASM, FIX_NAN, USE_GDC, PRE, TRIGGER, EMIT, L2, EVEN,
                      LUT_REG)
    else:
        _row_tile(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, part_ptr, alpha, tl.program_id(0),
                  tl.program_id(1).to(tl.int64), tl.program_id(2),
                  M, L, KB, per_split, s_al, s_am, s_sam, s_sak, s_sal, s_bl, s_sbk, s_sbl, s_om, s_ol,
                  BM, BB, PARTIAL, PREFETCH, USE_ASM, FIX_NAN, USE_GDC, PRE, TRIGGER, EMIT, L2, EVEN, LUT_REG)


# ---- host side -------------------------------------------------------------------------------------

def _blocks(t8: torch.Tensor) -> torch.Tensor:
    """uint8 [R, K/2, L] -> int64 [L, R, K/16] view (one scale block per element); copies only if unaligned."""
    v = t8.permute(2, 0, 1)
    # strides of size-1 dims never address memory; make them 8-divisible so the dtype view is allowed
    v = v.as_strided(v.shape, [st if n > 1 else 8 for st, n in zip(v.stride()[:2], v.shape[:2])] + [v.stride(2)],
                     v.storage_offset())
    try:
        return v.view(torch.int64)
    except RuntimeError:  # K not unit-stride, or rows not 8-byte aligned: one contiguous copy
        return v.clone(memory_format=torch.contiguous_format).view(torch.int64)


def gemv_tile(BB: int, R: int, nw: int) -> int:
    """Rows per program when each thread holds R rows x 2 blocks (16 bytes) and a warp spans 64 blocks."""
    warps_k = min(nw, max(1, BB // 64))
    return max(1, R * (nw // warps_k) * max(1, 64 // BB))


@dataclass(frozen=True)
class GemvConfig(KernelConfig):
    """The GEMV kernel's knobs (gemv_plan's docstring says what each does; gemv_plan picks them per shape)."""
    BM: int = 16
    BB: int = 64
    num_warps: int = 1
    split: int = 1
    num_stages: int = 1
    even: bool = False
    lut_reg: bool = True
    pdl: bool = False
    pre: int = 1
    trigger: str = "entry"
    l2: bool = False
    persistent: int = 0
    maxnreg: Optional[int] = None
    prefetch: bool = False


def gemv_plan(M: int, KB: int, L: int, device: torch.device, static_weights: bool = False) -> GemvConfig:
    """4 rows per thread (4 independent 16-byte loads in flight), warps side by side along K.

    static_weights (a and sfa not written by a kernel that may still run when this one starts): launch with
    programmatic dependent launch, first weight tile loaded before griddepcontrol.wait; one-warp programs over
    64 blocks for rows of 128-256 blocks with >= 16 row tiles per SM, else 4-warp programs over 256 blocks
    whenever rows are that long (H100 sweeps, benchmarks/notes/nvfp4_gemv.md: "What the device said", round 8).

    Measured on H100 (benchmarks/notes/nvfp4_gemv.md): 2-warp programs over 128 blocks win when there are few
    row tiles per SM, 4-warp programs over 256 blocks when there are many (>= 16 per SM); K is split only
    when the row tiles cannot fill the GPU.

    Optional keys read by gemv_launch (defaults = the measured v2 kernel): prefetch (bool); pdl (bool:
    programmatic dependent launch, Hopper+ only, ignored elsewhere), pre (0/1/2: weight tiles loaded
    before griddepcontrol.wait), trigger ("none" | "wait" | "last_load" | "entry": where the next kernel is
    allowed to launch); persistent (int, 0 = off: programs per SM of a grid-stride loop over row tiles); l2 (bool,
    with pdl: b and sfb prefetched into L2 before griddepcontrol.wait, see _row_tile); maxnreg (int: register cap
    per thread, so that more programs fit an SM); lut_reg (bool, default True: the prmt table word
    kept in a register, _LUT); even (bool: unmasked loads when M and the K blocks divide into
    whole tiles; prefetch reads past the last tile and keeps its masks).
    """
    sms = num_sms(device)
    R, even = 4, False
    if static_weights and 128 <= KB <= 256 and -(-M // R) * L >= 16 * sms:
        # one-warp programs of 64-block tiles (only the first loaded before the wait): fewer bytes preloaded, a
        # shorter decode burst after it (notes round 8: 84.9 -> 87.6 % at (7168, 2048, 4), 80.9 -> 84.1 % at
        # (14336, 4096, 1); slower with longer rows or fewer row tiles)
        BB, nw, even = 64, 1, True
    elif KB >= 256 and (static_weights or -(-M // R) * L >= 16 * sms):
        BB, nw = 256, 4
    elif KB >= 128:
        BB, nw = 128, 2
    else:  # short rows: one warp per program, rows spread over the warp's threads
        BB, nw = max(16, min(64, next_pow2(KB))), 1
    BM = gemv_tile(BB, R, nw)
    tiles = -(-M // BM) * L
    split = 1 if tiles >= sms else min(-(-2 * sms // tiles), -(-KB // BB))
    # even (unmasked loads, whole tiles only): 920 -> 880 instructions and +2.5 points for the one-warp static plan at
    # (7168, 2048, 4), 2.5-8 points slower for the other plans, so only there. lut_reg (the prmt table word in a
    # register, _LUT): +0.4 to +1.9 points where programs run several K tiles, 9 points slower for single-tile static
    # programs at (4096, 4096, 1), so only with several tiles. (Notes, round 11.)
    plan = GemvConfig(BM=BM, BB=BB, num_warps=nw, split=split, num_stages=1, even=even, lut_reg=KB > BB)
    if static_weights:  # read the first weight tile before waiting on the previous kernel (PDL), release the next at
        # once; b and sfb prefetched into L2 before the wait by the first row tile of each batch (notes round 10: +6
        # points at (4096, 4096, 1), within +-1 elsewhere)
        plan = plan.with_(dict(pdl=True, pre=1, trigger="entry", l2=True))
    return plan


TRIGGERS = {"none": 0, "wait": 1, "last_load": 2, "entry": 3}
_gemv_plan = functools.lru_cache(maxsize=1024)(gemv_plan)  # per call shape, read-only (the host path)


def gemv_launch(a8, b8, sa8, sb8, out, alpha: float, cfg=None, use_asm=None, static_weights: bool = False):
    """a8 uint8 [M, K/2, L]; b8 uint8 [N, K/2, L] (row 0 used); sa8/sb8 uint8 [., K/16, L]; out fp16 [M, 1, L].

    With cfg["pdl"] (Hopper+, not the interpreter) the kernel is launched with programmatic dependent launch:
    it may start while the preceding kernel on the stream is still running, and reads a8/sa8 (its first
    cfg["pre"] tiles) before griddepcontrol.wait; b8, sb8, out and the split-K partials are touched only after
    the wait (which returns once the preceding kernel has completed and its writes are visible). Contract:
    a8 and sa8 (weights) must not be written by a kernel that may still be running when this one starts: the
    preceding kernel on the stream, and, if that one lets its dependents launch early (trigger before its own
    end), the kernels before it back to the first that does not.
    """
    M, KH, L = a8.shape
    if M == 0 or L == 0:
        return out
    if KH // 8 == 0:
        return out.zero_()
    views = _views(a8, b8, sa8, sb8)
    GemvPlan(*views, out, alpha, cfg, use_asm, static_weights, kept=False)(*views, out)
    return out


def _views(a, b, sfa, sfb) -> tuple:
    """The GEMV kernel's tensor arguments (a64, sa8, b64, sb8) for nvfp4_gemv's a, b, sfa, sfb (uint8 or fp4 / fp8
    views of the same bytes): int64 block views of a and b's row 0 (copies only if unaligned), the scales as uint8."""
    return _blocks(u8(a)), u8(sfa), _blocks(u8(b)[:1])[:, 0], u8(sfb)[0]


class GemvPlan:
    """gemv_launch's launches for one call shape, worked out once (kept=True: the compiled kernels held, for a
    cached plan whose key fixes shapes, strides, dtypes and alignment; see _launch). Called with the int64 block
    views a64 [L, M, K/16] and b64 [L, K/16], sa8 [M, K/16, L], sb8 [K/16, L] and out [M, 1, L]. A kept kernel reads
    only the addresses of its tensor arguments, so a caller may pass any tensors at the views' addresses."""
    __slots__ = ("main", "reduce", "ints", "red_ints", "part_shape")

    def __init__(self, a64, sa8, b64, sb8, out, alpha, cfg=None, use_asm=None, static_weights=False, kept=True):
        L, M, KB = a64.shape
        cfg = GemvConfig.of(cfg) if cfg else _gemv_plan(M, KB, L, a64.device, static_weights)
        BM, BB = cfg.BM, cfg.BB
        per = -(-(-(-KB // cfg.split)) // BB) * BB  # blocks per split, a multiple of BB
        split = -(-KB // per)
        # cfg.pdl under the interpreter: the PDL code order (weights before the wait) without the launch
        order = cfg.pdl and (interpreting() or pdl_enabled(a64.device))
        pdl = order and not interpreting()
        n_mtiles = cdiv(M, BM)
        persistent = int(cfg.persistent) if split == 1 else 0
        if persistent:
            grid = (min(n_mtiles * L, persistent * num_sms(a64.device)), 1, 1)
        else:
            grid = (n_mtiles, L, split)
        self.part_shape = (split, L, M) if split > 1 else None
        if use_asm is None:
            use_asm = not interpreting()
        self.ints = (alpha if split == 1 else 1.0, M, L, KB, per, n_mtiles, a64.stride(0), a64.stride(1),
                     *sa8.stride(), *b64.stride()[:1], *sb8.stride(), out.stride(0), out.stride(2))
        go = Launch if kept else keyed
        self.main = go(_gemv_kernel, grid,
            BM=BM, BB=BB, PARTIAL=split > 1, PREFETCH=cfg.prefetch, USE_ASM=use_asm,
            FIX_NAN=interpreting(), USE_GDC=order, PRE=int(cfg.pre) if order else 0,
            TRIGGER=TRIGGERS[cfg.trigger] if order else 0, PERSISTENT=bool(persistent), EMIT=pdl,
            L2=bool(cfg.l2) and pdl,
            EVEN=bool(cfg.even) and M % BM == 0 and KB % BB == 0 and not cfg.prefetch,
            LUT_REG=bool(cfg.lut_reg),
            **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if pdl else {}))
        self.reduce = None
        if split > 1:
            blk = 256
            self.red_ints = (alpha, L, M, out.stride(2), out.stride(0))
            self.reduce = go(_nvfp4_splitk_reduce_kernel, (cdiv(M, blk), L), SPLIT=split, BLOCK=blk,
                             HAS_SCALE_PTR=False, HAS_BIAS=False, USE_GDC=pdl, **({"launch_pdl": True} if pdl else {}))

    def __call__(self, a64, sa8, b64, sb8, out):
        if self.reduce is None:
            self.main(a64, sa8, b64, sb8, out, out, *self.ints)
            return
        part = torch.empty(self.part_shape, dtype=torch.float32, device=out.device)
        self.main(a64, sa8, b64, sb8, out, part, *self.ints)
        self.reduce(part, out, part, part, *self.red_ints)


def gemv_kept_plan(a, b, sfa, sfb, out, alpha, static_weights):
    """A kept GemvPlan called with the raw (a, sfa, b, sfb, out) of nvfp4_gemv: only where the int64 block views
    are the raw tensors' own addresses (no copy), M, L and K/16 >= 1. Else None."""
    M, KH, L = a.shape
    if M == 0 or L == 0 or KH // 8 == 0:
        return None
    views = _views(a, b, sfa, sfb)
    if views[0].data_ptr() != a.data_ptr() or views[2].data_ptr() != b.data_ptr():
        return None
    return GemvPlan(*views, out, alpha, static_weights=static_weights)


def gemv_kept_call(plan, a, b, sfa, sfb, out) -> None:
    """Run a plan of gemv_kept_plan on nvfp4_gemv's raw tensors: they sit at the block views' addresses, which is
    all a kept kernel reads; Triton's path (the first call, launch hooks) gets the typed views."""
    if plan.main.direct():  # (the reduce only ever gets the fp32 parts and out)
        plan(a, sfa, b, sfb, out)
    else:
        plan(*_views(a, b, sfa, sfb), out)
