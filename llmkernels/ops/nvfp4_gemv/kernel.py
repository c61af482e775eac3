"""NVFP4 GEMV / weight-only linear for Hopper: E2M1 decoded in registers, fp32 accumulation.

GEMV (fp4 x fp4): one int64 = one 16-value scale block. Twice an E2M1 value is an integer in [-12, 12], so a
block's dot product sum (2a)(2b) is an exact int32, computed with byte lookups (prmt) and 4-way integer dot
products (dp4a); it is scaled by sfa * sfb / 4 in fp32 (exact: at most 16 significant bits) and accumulated in
fp32 across blocks. Under the Triton interpreter the same sums come from plain integer arithmetic.
"""
import functools

import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._runtime import capability, interpreting, num_sms
from ..combine.kernel import pdl_enabled, pdl_enter


def opaque_zero(z: str, tmp: str) -> str:
    """PTX setting register z to 0 (clobbers tmp) in a way ptxas can neither fold nor prove warp-uniform:
    (dynamic smem size + lane id) >> 30. ORed into a constant, it keeps the constant in one vector register, where
    ptxas would otherwise hold it in a uniform register and copy it before every use (prmt's first table word:
    12 % of the GEMV's instructions). ptxas knows the ranges of %tid.x and %laneid alone and folds those."""
    return (f"mov.u32 {z}, %dynamic_smem_size;\nmov.u32 {tmp}, %laneid;\n"
            f"add.u32 {z}, {z}, {tmp};\nshr.u32 {z}, {z}, 30;\n")


# byte lookup tables for prmt: 2*|e2m1| of codes 0..3 and 4..7 (0, 1, 2, 3 | 4, 6, 8, 12). prmt takes its second table
# word as an immediate but needs the first in a register: _LUT keeps it in one (opaque_zero), _LUT_IMM leaves the
# plain constant (copied before each prmt); gemv_plan picks one per plan (lut_reg).
_LUT = opaque_zero("qk0", "qk1") + "or.b32 qk0, qk0, 0x03020100;\nmov.b32 qk1, 0x0C080604;\n"
_LUT_IMM = "mov.b32 qk0, 0x03020100;\nmov.b32 qk1, 0x0C080604;\n"
_SEL = ("qlo", "ql16", "qhi", "qh16")  # selectors of values 0-3, 4-7, 8-11, 12-15 (prmt reads the low 16 bits)
_SPLIT = "mov.b64 {qlo, qhi}, %s;\nshr.b32 ql16, qlo, 16;\nshr.b32 qh16, qhi, 16;\n"


def _asm_b(lut=_LUT):
    """b block (int64) -> 2b as int8x4 (values 0-3, 4-7, 8-11, 12-15) and its negation."""
    s = "{\n.reg .b32 qlo, qhi, ql16, qh16, qk0, qk1, qm, qp, qn, qs, qu;\n" + _SPLIT % "$8" + lut
    s += "mov.b32 qm, 0x80808080;\n"
    for g, q in enumerate(_SEL):
        s += (f"prmt.b32 qp, qk0, qk1, {q};\n"          # |2b| where b >= 0, else 0 (sign bit set: msb copy of 0)
              f"xor.b32 qs, {q}, 0x8888;\n"
              f"prmt.b32 qn, qk0, qk1, qs;\n"             # |2b| where b < 0, else 0
              # bytewise p - n and n - p; one side is 0 and the other <= 12, so (0x80 - x) ^ 0x80 is -x per byte
              f"sub.u32 qu, qm, qn;\nxor.b32 qu, qu, qm;\nor.b32 ${g}, qp, qu;\n"
              f"sub.u32 qu, qm, qp;\nxor.b32 qu, qu, qm;\nor.b32 ${g + 4}, qn, qu;\n")
    return s + "}"


def _asm_a(lut=_LUT):
    """a block (int64), 2b (4 x int8x4), -2b (4 x int8x4) -> sum over the block of (2a)(2b), int32."""
    s = "{\n.reg .b32 qlo, qhi, ql16, qh16, qk0, qk1, qs, qt, qacc;\n" + _SPLIT % "$1" + lut + "mov.b32 qacc, 0;\n"
    for g, q in enumerate(_SEL):
        s += (f"prmt.b32 qt, qk0, qk1, {q};\ndp4a.s32.s32 qacc, qt, ${2 + g}, qacc;\n"   # a >= 0 lanes times 2b
              f"xor.b32 qs, {q}, 0x8888;\nprmt.b32 qt, qk0, qk1, qs;\n"
              f"dp4a.s32.s32 qacc, qt, ${6 + g}, qacc;\n")                         # a < 0 lanes times -2b
    return s + "mov.b32 $0, qacc;\n}"


def _tables(bf16: bool) -> str:
    """PTX setting la, lb (low bytes) and ha, hb (high bytes) to byte tables of the 16-bit patterns of the E2M1
    magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0-3 in la / ha, 4-7 in lb / hb), for prmt lookups. bf16: low bytes
    00 00 80 c0 00 40 80 c0, high 00 3f 3f 3f 40 40 40 40; fp16: low bytes all 00, high 00 38 3c 3e 40 42 44 46."""
    la, lb = ("0xC0800000", "0xC0804000") if bf16 else ("0x00000000", "0x00000000")
    ha, hb = ("0x3F3F3F00", "0x40404040") if bf16 else ("0x3E3C3800", "0x46444240")
    return f"mov.b32 la, {la};\nmov.b32 lb, {lb};\nmov.b32 ha, {ha};\nmov.b32 hb, {hb};\n"


def _asm_w16(bf16: bool):
    """4 weight bytes ($4) and their scales (16-bit x2: $5 for bytes 0-1, $6 for bytes 2-3) -> the low-nibble
    values of the 4 bytes ($0: bytes 0-1, $1: bytes 2-3) and the high-nibble values ($2, $3), each e2m1 * scale
    as bf16 or fp16 (exact: <= 6 significant bits in [2^-10, 2688]). prmt looks the magnitudes up in byte
    tables (code 0 -> 0, so the spare selector nibbles give zero bytes), prmt's sign-replicate mode copies each
    code's sign bit, one mul.rn.x2 applies the scale to two values."""
    mul = "mul.rn.bf16x2" if bf16 else "mul.rn.f16x2"
    s = "{\n.reg .b32 la, lb, ha, hb, m, sg, t, u, v, ss;\n" + _tables(bf16)
    for out, (shift, signsrc) in enumerate([(0, "ss"), (4, "$4")]):  # low nibbles, then high nibbles
        s += f"shr.b32 m, $4, {shift};\nand.b32 m, m, 0x07070707;\n" if shift else "and.b32 m, $4, 0x07070707;\n"
        if out == 0:
            s += "shl.b32 ss, $4, 4;\n"  # the msb of byte j of ss is the sign of byte j's low code
        for half in range(2):  # bytes 0-1, then 2-3
            sel = "m" if half == 0 else "t"
            if half:
                s += "shr.b32 t, m, 16;\n"
            if bf16:
                s += (f"prmt.b32 u, la, lb, {sel};\nprmt.b32 v, ha, hb, {sel};\n"
                      "prmt.b32 v, u, v, 0x6240;\n")  # [lo(c), hi(c), lo(c'), hi(c')]
            else:
                s += f"prmt.b32 v, ha, hb, {sel};\nshl.b32 v, v, 8;\n"
            s += (f"prmt.b32 sg, {signsrc}, {signsrc}, {'0x9080' if half == 0 else '0xB0A0'};\n"
                  "lop3.b32 v, v, sg, 0x80008000, 0xF8;\n"   # v | (sg & 0x80008000)
                  f"{mul} ${2 * out + half}, v, ${5 + half};\n")
    return s + "}"


def _asm_mma(bf16: bool, nt: int = 1):
    """One thread's share of 4 mma.m16n8k16 steps over nt groups of 8 tokens. Operands (A = 4 nt): accumulators
    $0..$A-1 (tied to $A..$2A-1), 4 per token group in the fragment order (row r: tokens 2t, 2t + 1; row r + 8: the
    same); weight bytes of rows r ($2A) and r + 8 ($2A+1) (8 bytes each, one scale block); their scales ($2A+2,
    $2A+3: 16-bit); then per token group the 16 activations of its token n (4 words of 4 x 16-bit). Each 16-bit
    chunk of weights (4 codes) becomes two scaled pairs (the A registers of k slots 2t..2t+1 and 2t+8..2t+9); the
    matching 4 activations are the two halves of one 64-bit activation word. The weights are decoded once for all
    token groups."""
    na = 4 * nt
    wt, wb, st, sb = 2 * na, 2 * na + 1, 2 * na + 2, 2 * na + 3
    ty = "bf16" if bf16 else "f16"
    s = ("{\n.reg .b32 la, lb, ha, hb, w<4>, mw<4>, tw<4>, m, u, v, sg, sc<2>, a<4>, b<2>;\n" + _tables(bf16) +
         f"mov.b64 {{w0, w1}}, ${wt};\nmov.b64 {{w2, w3}}, ${wb};\n"
         f"mov.b32 sc0, {{${st}, ${st}}};\nmov.b32 sc1, {{${sb}, ${sb}}};\n")

    def pair(word, half, dst_a, dst_b, sc):
        """codes of bytes 2*half, 2*half + 1 of `word` -> scaled pairs in dst_a (first byte), dst_b (second).
        m<word> holds the word's magnitudes (& 0x77777777), t<word> the word << 4 (low codes' signs at byte msbs)."""
        sel = f"m{word}"
        out = ""
        if half:
            out += f"shr.b32 m, m{word}, 16;\n"
            sel = "m"
        out += f"prmt.b32 u, la, lb, {sel};\nprmt.b32 v, ha, hb, {sel};\n"
        for dst, (inter, sgn) in ((dst_a, ("0x5140", "0xC080" if not half else "0xE0A0")),
                                  (dst_b, ("0x7362", "0xD090" if not half else "0xF0B0"))):
            out += (f"prmt.b32 {dst}, u, v, {inter};\nprmt.b32 sg, t{word}, {word}, {sgn};\n"
                    f"lop3.b32 {dst}, {dst}, sg, 0x80008000, 0xF8;\nmul.rn.{ty}x2 {dst}, {dst}, {sc};\n")
        return out

    for i in range(4):  # once per word: magnitudes and shifted signs, shared by its two 16-bit halves
        s += f"and.b32 mw{i}, w{i}, 0x77777777;\nshl.b32 tw{i}, w{i}, 4;\n"
    for j in range(4):  # weight byte pair j of each row, activation word j
        word_t, word_b, half = (f"w{j // 2}", f"w{2 + j // 2}", j % 2)
        s += pair(word_t, half, "a0", "a2", "sc0") + pair(word_b, half, "a1", "a3", "sc1")
        for q in range(nt):
            d = ", ".join(f"${4 * q + i}" for i in range(4))
            s += (f"mov.b64 {{b0, b1}}, ${2 * na + 4 + 4 * q + j};\n"
                  f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{a0, a1, a2, a3}}, "
                  f"{{b0, b1}}, {{{d}}};\n")
    return s + "}"


ASM_MMA_BF16 = tl.constexpr(_asm_mma(True))
ASM_MMA_F16 = tl.constexpr(_asm_mma(False))
ASM_MMA2_BF16 = tl.constexpr(_asm_mma(True, 2))
ASM_MMA2_F16 = tl.constexpr(_asm_mma(False, 2))
ASM_W16_BF16 = tl.constexpr(_asm_w16(True))
ASM_W16_F16 = tl.constexpr(_asm_w16(False))
ASM_B = tl.constexpr(_asm_b())
ASM_A = tl.constexpr(_asm_a())
ASM_B_IMM = tl.constexpr(_asm_b(_LUT_IMM))
ASM_A_IMM = tl.constexpr(_asm_a(_LUT_IMM))


@triton.jit
def _e4m3_f32(u8, FIX_NAN: tl.constexpr):
    v = u8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if FIX_NAN:  # the interpreter decodes 0x7f/0xff as +-480; the GPU's conversion gives NaN
        v = tl.where((u8 & 0x7F) == 0x7F, float("nan"), v)
    return v


@triton.jit
def _e2m1_f16(c):
    """E2M1 codes (low 4 bits) -> fp16 holding value * 2^-14 (exact: the code's bits placed in fp16 fields)."""
    c16 = c.to(tl.uint16)
    return (((c16 & 7) << 9) | ((c16 & 8) << 12)).to(tl.float16, bitcast=True)


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
    scale = _e4m3_f32(sa, FIX_NAN) * (_e4m3_f32(sb, FIX_NAN) * 0.25)
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


@triton.jit
def _nvfp4_splitk_reduce_kernel(part_ptr, out_ptr, scale_ptr, bias_ptr, alpha, R, C, s_or, s_oc,
                   SPLIT: tl.constexpr, BLOCK: tl.constexpr, HAS_SCALE_PTR: tl.constexpr, HAS_BIAS: tl.constexpr,
                   USE_GDC: tl.constexpr = False):
    """out[r, c] = alpha * (scale) * sum_s part[s, r, c] (+ bias[c]), in a fixed order (deterministic).

    USE_GDC: launched with programmatic dependent launch after the split kernel: wait for its partials."""
    pdl_enter(USE_GDC)
    r = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + (s * R + r) * C + cols, mask=ok, other=0.0)
    acc = acc * alpha
    if HAS_SCALE_PTR:
        acc = acc * tl.load(scale_ptr)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * s_or + cols * s_oc, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _linear_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr,
                   T, N, KH, per_split, s_xt, s_wn, s_sn, s_yt,
                   BN: tl.constexpr, BKH: tl.constexpr, TP: tl.constexpr, PARTIAL: tl.constexpr,
                   HAS_BIAS: tl.constexpr, FIX_NAN: tl.constexpr, USE_ASM: tl.constexpr):
    """y [T, N] = x [T, K] @ W^T: the weight tile is decoded once for all T (<= TP) tokens; tensor-core dot."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    row_ok = rows < N
    toks = tl.arange(0, TP)
    tok_ok = toks < T
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, KH)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * s_wn
    s_rows = s_ptr + rows[:, None].to(tl.int64) * s_sn
    acc = tl.zeros([BN, TP], tl.float32)
    for k0 in range(k_lo, k_hi, BKH):
        kb = k0 + tl.arange(0, BKH)  # byte index: values 2kb (low nibble) and 2kb + 1 (high nibble)
        k_ok = kb < k_hi
        w = tl.load(w_rows + kb[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0)
        sk = k0 // 8 + tl.arange(0, BKH // 8)
        sc = tl.load(s_rows + sk[None, :], mask=row_ok[:, None] & (sk * 8 < k_hi)[None, :], other=0)
        xm = k_ok[:, None] & tok_ok[None, :]
        xe = tl.load(x_ptr + toks[None, :] * s_xt + 2 * kb[:, None], mask=xm, other=0.0)  # [BKH, TP]
        xo = tl.load(x_ptr + toks[None, :] * s_xt + 2 * kb[:, None] + 1, mask=xm, other=0.0)
        # e2m1 * scale has <= 6 significant bits and lies in [2^-10, 2688]: exact in fp16 and bf16
        if USE_ASM:  # two values per instruction, the scale applied in 16 bits (exact, as above)
            sc = tl.reshape(tl.broadcast_to(_e4m3_f32(sc, False).to(xe.dtype)[:, :, None], [BN, BKH // 8, 8]),
                            [BN, BKH])
            lo, hi = tl.inline_asm_elementwise(
                ASM_W16_BF16 if xe.dtype == tl.bfloat16 else ASM_W16_F16, "=r,=r,=r,=r,r,r,r", [w, sc],
                dtype=(xe.dtype, xe.dtype), is_pure=True, pack=4)
        else:
            sc = _e4m3_f32(sc, FIX_NAN) * 16384.0  # undoes the 2^-14 of _e2m1_f16
            sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BN, BKH // 8, 8]), [BN, BKH])
            lo = (_e2m1_f16(w & 15).to(tl.float32) * sc).to(xe.dtype)
            hi = (_e2m1_f16(w >> 4).to(tl.float32) * sc).to(xe.dtype)
        acc = tl.dot(lo, xe, acc)
        acc = tl.dot(hi, xo, acc)
    if PARTIAL:
        tl.store(part_ptr + (split * T + toks[None, :]) * N + rows[:, None], acc,
                 mask=row_ok[:, None] & tok_ok[None, :])
    else:
        acc = acc * tl.load(gs_ptr)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + toks[None, :] * s_yt + rows[:, None], acc.to(y_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & tok_ok[None, :])


@triton.jit
def _store_out(acc, row, t, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one,
               PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Store one accumulator of the mma kernel (or its split-K partial). Offsets times the runtime 1, like every
    lane-dependent offset there: an address that looks contiguous would change the layout Triton picks."""
    ok = (row < N) & (t < T)
    off = row * one
    if PARTIAL:
        tl.store(part_ptr + (split * T + t) * N + off, acc, mask=ok)
    else:
        v = acc * tl.load(gs_ptr)
        if HAS_BIAS:
            v += tl.load(bias_ptr + off, mask=row < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * s_yt + off, v.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _mma_weights(w_ptr, s_ptr, r_top, r_bot, kw, k_ok, N, s_wn, s_sn, DT: tl.constexpr):
    """Weight word kw (one scale block) of rows r_top and r_bot, and their scales in the activations' type."""
    m_t = (r_top < N) & k_ok
    m_b = (r_bot < N) & k_ok
    wt = tl.load(w_ptr + r_top.to(tl.int64) * s_wn + kw, mask=m_t, other=0)
    wb = tl.load(w_ptr + r_bot.to(tl.int64) * s_wn + kw, mask=m_b, other=0)
    st = _e4m3_f32(tl.load(s_ptr + r_top.to(tl.int64) * s_sn + kw, mask=m_t, other=0), False).to(DT)
    sb = _e4m3_f32(tl.load(s_ptr + r_bot.to(tl.int64) * s_sn + kw, mask=m_b, other=0), False).to(DT)
    return wt, wb, st, sb


@triton.jit
def _mma_acts(x_ptr, tok, kw, k_ok, T, s_xt, one):
    """The 4 activation words (16 values) of token `tok` over the columns of weight word kw."""
    xm = (tok < T) & k_ok
    xb = x_ptr + tok * s_xt + 4 * kw
    return (tl.load(xb, mask=xm, other=0), tl.load(xb + one, mask=xm, other=0),
            tl.load(xb + 2 * one, mask=xm, other=0), tl.load(xb + 3 * one, mask=xm, other=0))


@triton.jit
def _mma_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w_ptr, s_ptr, x_ptr, r_top, r_bot, tok, kw, k_hi,
              N, T, s_wn, s_sn, s_xt, one, DT: tl.constexpr, NT: tl.constexpr, K_MASK: tl.constexpr):
    """One mma step (weight word kw of rows r_top / r_bot) for NT groups of 8 tokens; K_MASK: kw may be >= k_hi."""
    if K_MASK:
        k_ok = kw < k_hi
    else:
        k_ok = True
    wt, wb, st, sb = _mma_weights(w_ptr, s_ptr, r_top, r_bot, kw, k_ok, N, s_wn, s_sn, DT)
    x0, x1, x2, x3 = _mma_acts(x_ptr, tok, kw, k_ok, T, s_xt, one)
    if NT == 2:
        x4, x5, x6, x7 = _mma_acts(x_ptr, tok + 8, kw, k_ok, T, s_xt, one)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = tl.inline_asm_elementwise(
            ASM_MMA2_BF16 if DT == tl.bfloat16 else ASM_MMA2_F16,
            "=f,=f,=f,=f,=f,=f,=f,=f,0,1,2,3,4,5,6,7,l,l,h,h,l,l,l,l,l,l,l,l",
            [acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7],
            dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
            ASM_MMA_BF16 if DT == tl.bfloat16 else ASM_MMA_F16, "=f,=f,=f,=f,0,1,2,3,l,l,h,h,l,l,l,l",
            [acc0, acc1, acc2, acc3, wt, wb, st, sb, x0, x1, x2, x3],
            dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit(do_not_specialize=["one"])
def _linear_mma_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr,
                       T, N, KW, per_split, s_xt, s_wn, s_sn, s_yt, one,
                       W: tl.constexpr, U: tl.constexpr, NT: tl.constexpr, PARTIAL: tl.constexpr,
                       HAS_BIAS: tl.constexpr):
    """y [T <= 8 NT, N] = x @ W^T on mma.sync m16n8k16 fed from registers: warp g of the program owns rows
    16g..16g+15 (of BM = 16 W), tokens are the mma's N (NT groups of 8, the weights decoded once for all). x_ptr
    int64 [T, K/4] (4 activations a word), w_ptr int64 [N, K/16] (one scale block a word), s_ptr uint8 [N, K/16];
    KW = K/16 words per row.

    Element e of the [32 W] tensors below must live in lane e % 32 of warp e // 32 (so lane = 4 * group + thread
    in group, the mma fragment order): Triton's default layout for a 1-D tensor of 32 W elements over W warps, as
    long as no address looks contiguous (which would give a thread several elements): the runtime `one` (= 1, not
    specialised) sees to that. The GPU tests check the result."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    pid = tl.program_id(0)
    split = tl.program_id(1)
    e = tl.arange(0, 32 * W)
    lane = e % 32
    c = (lane % 4) * one  # thread in group: its scale block within 4 consecutive ones
    r_top = pid * (16 * W) + (e // 32) * 16 + lane // 4
    r_bot = r_top + 8
    tok = lane // 4  # the mma's column n: a token (of each group of 8)
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, KW)
    # per group of 8 tokens: (row r, token 2c), (r, 2c + 1), (r + 8, 2c), (r + 8, 2c + 1)
    acc0 = tl.zeros([32 * W], tl.float32)
    acc1 = tl.zeros([32 * W], tl.float32)
    acc2 = tl.zeros([32 * W], tl.float32)
    acc3 = tl.zeros([32 * W], tl.float32)
    acc4 = tl.zeros([32 * W], tl.float32)
    acc5 = tl.zeros([32 * W], tl.float32)
    acc6 = tl.zeros([32 * W], tl.float32)
    acc7 = tl.zeros([32 * W], tl.float32)
    # whole steps without K masks (the row and token masks are loop-invariant), then the tail with them
    k_full = k_lo + (k_hi - k_lo) // (4 * U) * (4 * U)
    for k0 in range(k_lo, k_full, 4 * U):
        for u in tl.static_range(U):
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _mma_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w_ptr, s_ptr, x_ptr, r_top, r_bot, tok,
                k0 + 4 * u + c, k_hi, N, T, s_wn, s_sn, s_xt, one, DT, NT, False)
    for k0 in range(k_full, k_hi, 4 * U):
        for u in tl.static_range(U):
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _mma_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w_ptr, s_ptr, x_ptr, r_top, r_bot, tok,
                k0 + 4 * u + c, k_hi, N, T, s_wn, s_sn, s_xt, one, DT, NT, True)
    t0 = 2 * c
    _store_out(acc0, r_top, t0, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
    _store_out(acc1, r_top, t0 + 1, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
    _store_out(acc2, r_bot, t0, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
    _store_out(acc3, r_bot, t0 + 1, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
    if NT == 2:
        _store_out(acc4, r_top, t0 + 8, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
        _store_out(acc5, r_top, t0 + 9, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
        _store_out(acc6, r_bot, t0 + 8, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)
        _store_out(acc7, r_bot, t0 + 9, split, T, N, gs_ptr, bias_ptr, y_ptr, part_ptr, s_yt, one, PARTIAL, HAS_BIAS)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, gs_ptr, out_ptr, N, KH, s_wn, s_sn, s_on,
                    BN: tl.constexpr, BKH: tl.constexpr, FIX_NAN: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BKH
    kb = k0 + tl.arange(0, BKH)
    m2 = (rows < N)[:, None] & (kb < KH)[None, :]
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * s_wn + kb[None, :], mask=m2, other=0)
    sk = k0 // 8 + tl.arange(0, BKH // 8)
    sc = tl.load(s_ptr + rows[:, None].to(tl.int64) * s_sn + sk[None, :],
                 mask=(rows < N)[:, None] & (sk * 8 < KH)[None, :], other=0)
    sc = _e4m3_f32(sc, FIX_NAN) * (16384.0 * tl.load(gs_ptr))
    sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BN, BKH // 8, 8]), [BN, BKH])
    lo = _e2m1_f16(w & 15).to(tl.float32) * sc
    hi = _e2m1_f16(w >> 4).to(tl.float32) * sc
    v = tl.reshape(tl.join(lo, hi), [BN, 2 * BKH])  # interleave: value 2kb then 2kb + 1
    cols = 2 * k0 + tl.arange(0, 2 * BKH)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * s_on + cols[None, :], v.to(out_ptr.dtype.element_ty),
             mask=(rows < N)[:, None] & (cols < 2 * KH)[None, :])


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


def gemv_plan(M: int, KB: int, L: int, device: torch.device, static_weights: bool = False) -> dict:
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
        BB, nw = max(16, min(64, triton.next_power_of_2(KB))), 1
    BM = gemv_tile(BB, R, nw)
    tiles = -(-M // BM) * L
    split = 1 if tiles >= sms else min(-(-2 * sms // tiles), -(-KB // BB))
    # even (unmasked loads, whole tiles only): 920 -> 880 instructions and +2.5 points for the one-warp static plan at
    # (7168, 2048, 4), 2.5-8 points slower for the other plans, so only there. lut_reg (the prmt table word in a
    # register, _LUT): +0.4 to +1.9 points where programs run several K tiles, 9 points slower for single-tile static
    # programs at (4096, 4096, 1), so only with several tiles. (Notes, round 11.)
    plan = dict(BM=BM, BB=BB, num_warps=nw, split=split, num_stages=1, even=even, lut_reg=KB > BB)
    if static_weights:  # read the first weight tile before waiting on the previous kernel (PDL), release the next at
        # once; b and sfb prefetched into L2 before the wait by the first row tile of each batch (notes round 10: +6
        # points at (4096, 4096, 1), within +-1 elsewhere)
        plan.update(pdl=True, pre=1, trigger="entry", l2=True)
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
    KB = KH // 8
    if M == 0 or L == 0:
        return out
    if KB == 0:
        return out.zero_()
    a64 = _blocks(a8)
    b64 = _blocks(b8[:1])[:, 0]
    sb8 = sb8[0]
    cfg = cfg or _gemv_plan(M, KB, L, a8.device, static_weights)
    BM, BB = cfg["BM"], cfg["BB"]
    per = -(-(-(-KB // cfg["split"])) // BB) * BB  # blocks per split, a multiple of BB
    split = -(-KB // per)
    # cfg["pdl"] under the interpreter: the PDL code order (weights before the wait) without the launch
    order = bool(cfg.get("pdl", False)) and (interpreting() or pdl_enabled(a8.device))
    pdl = order and not interpreting()
    n_mtiles = triton.cdiv(M, BM)
    persistent = int(cfg.get("persistent", 0)) if split == 1 else 0
    if persistent:
        grid = (min(n_mtiles * L, persistent * num_sms(a8.device)), 1, 1)
    else:
        grid = (n_mtiles, L, split)
    part = torch.empty(split, L, M, dtype=torch.float32, device=a8.device) if split > 1 else out
    if use_asm is None:
        use_asm = not interpreting()
    launch(_gemv_kernel, grid,
        a64, sa8, b64, sb8, out, part, alpha if split == 1 else 1.0,
        M, L, KB, per, n_mtiles,
        a64.stride(0), a64.stride(1), *sa8.stride(), *b64.stride()[:1], *sb8.stride(), out.stride(0), out.stride(2),
        BM=BM, BB=BB, PARTIAL=split > 1, PREFETCH=cfg.get("prefetch", False), USE_ASM=use_asm,
        FIX_NAN=interpreting(), USE_GDC=order, PRE=int(cfg.get("pre", 1)) if order else 0,
        TRIGGER=TRIGGERS[cfg.get("trigger", "entry")] if order else 0, PERSISTENT=bool(persistent), EMIT=pdl,
        L2=bool(cfg.get("l2", False)) and pdl,
        EVEN=bool(cfg.get("even")) and M % BM == 0 and KB % BB == 0 and not cfg.get("prefetch"),
        LUT_REG=bool(cfg.get("lut_reg", True)),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
        num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 1), **({"launch_pdl": True} if pdl else {}))
    if split > 1:
        blk = 256
        launch(_nvfp4_splitk_reduce_kernel, (triton.cdiv(M, blk), L), part, out, part, part, alpha, L, M, out.stride(2),
               out.stride(0), SPLIT=split, BLOCK=blk, HAS_SCALE_PTR=False, HAS_BIAS=False, USE_GDC=pdl,
               **({"launch_pdl": True} if pdl else {}))
    return out


MAX_FUSED_T = 16  # tokens handled by the fused kernel (weights read once); above that: dequantize + matmul


def linear_plan(T: int, N: int, KH: int, device: torch.device) -> dict:
    """Measured on H100: 128-row tiles with 8 warps for <= 4 tokens, 64-row tiles with 4 warps above."""
    BN, BKH, nw = (128, 64, 8) if T <= 4 else (64, 128, 4)
    tiles = triton.cdiv(N, BN)
    target = 2 * num_sms(device)
    split = 1 if tiles >= target else min(-(-target // tiles), triton.cdiv(KH, BKH))
    return dict(BN=BN, BKH=BKH, num_warps=nw, split=split, num_stages=2)


_linear_plan = functools.lru_cache(maxsize=1024)(linear_plan)  # per call shape, read-only (the host path)


def _unit_k(t: torch.Tensor) -> torch.Tensor:
    """The [rows, K-bytes] weight or scale matrix with unit stride along K (copied once if not)."""
    return t if t.stride(1) == 1 else t.contiguous()


def _reduce_linear(part, y, gs, bias):
    """y [T, N] = global scale * sum over splits of part [S, T, N] (+ bias), in a fixed order."""
    S, T, N = part.shape
    blk = 256
    launch(_nvfp4_splitk_reduce_kernel, (triton.cdiv(N, blk), T), part, y, gs, bias if bias is not None else gs, 1.0,
           T, N, y.stride(0), 1, SPLIT=S, BLOCK=blk, HAS_SCALE_PTR=True, HAS_BIAS=bias is not None)


MMA_MAX_T = 16  # tokens of the register-fed mma kernel: one or two groups of 8 (the mma's N)


def _mma_usable(x, w8, y) -> bool:
    """sm_90+ (mma.sync, mul.rn.bf16x2), at most 16 tokens, 8-byte aligned rows of weights and activations."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return (x.shape[0] <= MMA_MAX_T and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0
            and w8.stride(0) % 8 == 0 and w8.data_ptr() % 8 == 0 and y.stride(1) == 1)


def linear_mma_launch(x, w8, s8, gs, bias, y, cfg=None):
    """T <= 16: the mma-fragment kernel. x [T, K], w8 uint8 [N, K/2] (8-byte aligned rows), s8 uint8 [N, K/16]."""
    T, K = x.shape
    N, KH = w8.shape
    KW = KH // 8
    c = {"W": 4, "U": 4, "programs_per_sm": 8, **(cfg or {})}
    BM = 16 * c["W"]
    tiles = triton.cdiv(N, BM)
    step = 4 * c["U"]
    target = c["programs_per_sm"] * num_sms(x.device)
    split = 1 if tiles >= target else min(-(-target // tiles), triton.cdiv(KW, step))
    per = -(-(-(-KW // split)) // step) * step
    split = max(1, -(-KW // per))
    part = torch.empty(split, T, N, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_linear_mma_kernel, (tiles, split),
        x.view(torch.int64), w8.view(torch.int64), s8, gs, bias if bias is not None else gs, y, part,
        T, N, KW, per, x.stride(0) // 4, w8.stride(0) // 8, s8.stride(0), y.stride(0), 1,
        W=c["W"], U=c["U"], NT=1 if T <= 8 else 2, PARTIAL=split > 1, HAS_BIAS=bias is not None,
        num_warps=c["W"])
    if split > 1:
        _reduce_linear(part, y, gs, bias)
    return y


def _asm_decode_usable(x) -> bool:
    """The dot kernel's inline-PTX decode: mul.rn.f16x2 (sm_53+) for fp16, mul.rn.bf16x2 (sm_90+) for bf16; elsewhere
    (bf16 before Hopper, the interpreter) the element-wise decode."""
    if interpreting() or x.device.type != "cuda":
        return False
    return x.dtype == torch.float16 or capability(x.device)[0] >= 9


def linear_launch(x, w8, s8, gs, bias, y, cfg=None, use_asm=None):
    """x [T, K] (unit last stride), w8 uint8 [N, K/2], s8 uint8 [N, K/16], gs fp32 [1] -> y [T, N].

    T <= 16 on sm_90 with 8-byte aligned rows: the register-fed mma kernel (cfg {"kernel": "dot"} or a dot-kernel
    cfg (with "BN") skips it; W / U / programs_per_sm tune it); else the dot kernel (use_asm=False: with
    its element-wise decode, and never the mma kernel)."""
    T, K = x.shape
    N, KH = w8.shape
    if T == 0 or N == 0:
        return y
    w8, s8 = _unit_k(w8), _unit_k(s8)
    kernel = (cfg or {}).get("kernel") or ("dot" if use_asm is False or (cfg and "BN" in cfg) else "mma")
    if kernel == "mma" and _mma_usable(x, w8, y):  # sm_90: ~2x the dot kernel (notes, linear rounds 3-4)
        return linear_mma_launch(x, w8, s8, gs, bias, y, {k: v for k, v in (cfg or {}).items() if k != "kernel"})
    cfg = {k: v for k, v in cfg.items() if k != "kernel"} if cfg and "BN" in cfg else _linear_plan(T, N, KH, x.device)
    BN, BKH = cfg["BN"], cfg["BKH"]
    per = -(-(-(-KH // cfg["split"])) // BKH) * BKH
    split = max(1, -(-KH // per))
    part = torch.empty(split, T, N, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_linear_kernel, (triton.cdiv(N, BN), split),
        x, w8, s8, gs, bias if bias is not None else gs, y, part,
        T, N, KH, per, x.stride(0), w8.stride(0), s8.stride(0), y.stride(0),
        BN=BN, BKH=BKH, TP=max(16, triton.next_power_of_2(T)), PARTIAL=split > 1, HAS_BIAS=bias is not None,
        FIX_NAN=interpreting(), USE_ASM=_asm_decode_usable(x) if use_asm is None else use_asm,
        num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 2))
    if split > 1:
        _reduce_linear(part, y, gs, bias)
    return y


def dequant_launch(w8, s8, gs, out):
    """w8 uint8 [N, K/2], s8 uint8 [N, K/16], gs fp32 [1] -> out [N, K] (e2m1 * scale * gs, rounded once)."""
    N, KH = w8.shape
    if N == 0 or KH == 0:
        return out
    w8, s8 = _unit_k(w8), _unit_k(s8)
    BN, BKH = 32, 128
    launch(_dequant_kernel, (triton.cdiv(N, BN), triton.cdiv(KH, BKH)),
        w8, s8, gs, out, N, KH, w8.stride(0), s8.stride(0), out.stride(0), BN=BN, BKH=BKH,
        FIX_NAN=interpreting(), num_warps=4)
    return out
