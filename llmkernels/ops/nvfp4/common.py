"""NVFP4 decoding shared by the GEMV (gemv.py) and the weight-only linear (linear.py): the inline-PTX builders
(byte-lookup decode of a scale block, the decode into mma fragments), the E4M3 / E2M1 element decoders, and the
split-K reduce both launch."""
import triton
import triton.language as tl

from ..._pdl import pdl_enter


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


def asm_mma_tokens(ty: str, nt: int, act: int) -> str:
    """The mma.m16n8k16 of A fragment {a0..a3} for each of nt token groups: group q's accumulators $4q..$4q+3, its
    activation word operand $(act + 4q) as {b0, b1}."""
    s = ""
    for q in range(nt):
        d = ", ".join(f"${4 * q + i}" for i in range(4))
        s += (f"mov.b64 {{b0, b1}}, ${act + 4 * q};\n"
              f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{a0, a1, a2, a3}}, "
              f"{{b0, b1}}, {{{d}}};\n")
    return s


def _asm_mma(bf16: bool, nt: int = 1):
    """One thread's share of 4 mma.m16n8k16 steps over nt groups of 8 tokens. Operands (A = 4 nt): accumulators
    $0..$A-1 (tied to $A..$2A-1), 4 per token group in the fragment order (row r: tokens 2t, 2t + 1; row r + 8: the
    same); weight bytes of rows r ($2A) and r + 8 ($2A+1) (8 bytes each, one scale block); their scales ($2A+2,
    $2A+3: 16-bit); then per token group the 16 activations of its token n (4 words of 4 x 16-bit). Each 16-bit
    chunk of weights (4 codes) becomes two scaled pairs (the A registers of k slots 2t..2t+1 and 2t+8..2t+9); the
    matching 4 activations are the two halves of one 64-bit activation word. The weights are decoded once for all
    token groups. The last 4 operands are the byte tables (la, lb, ha, hb of _tables, from _asm_tables): held in
    vector registers across the loop, where constants here would be copied from uniform registers before every
    prmt (63 IMAD an iteration)."""
    na = 4 * nt
    wt, wb, st, sb = 2 * na, 2 * na + 1, 2 * na + 2, 2 * na + 3
    tab = 2 * na + 4 + 4 * nt
    ty = "bf16" if bf16 else "f16"
    s = ("{\n.reg .b32 la, lb, ha, hb, w<4>, mw<4>, tw<4>, m, u, v, sg, sc<2>, a<4>, b<2>;\n" +
         f"mov.b32 la, ${tab};\nmov.b32 lb, ${tab + 1};\nmov.b32 ha, ${tab + 2};\nmov.b32 hb, ${tab + 3};\n" +
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
        s += asm_mma_tokens(ty, nt, 2 * na + 4 + j)
    return s + "}"


def _asm_tables(bf16: bool) -> str:
    """The 4 byte tables of _tables ($0..$3), each ORed with an opaque zero so ptxas keeps them in vector registers
    ($4: any input, unused)."""
    s = "{\n.reg .b32 la, lb, ha, hb, z, t;\n" + _tables(bf16) + opaque_zero("z", "t")
    return s + "".join(f"or.b32 ${i}, z, {r};\n" for i, r in enumerate(("la", "lb", "ha", "hb"))) + "}"


ASM_TABLES_BF16 = tl.constexpr(_asm_tables(True))
ASM_TABLES_F16 = tl.constexpr(_asm_tables(False))
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
def e4m3_f32(u8, FIX_NAN: tl.constexpr):
    v = u8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if FIX_NAN:  # the interpreter decodes 0x7f/0xff as +-480; the GPU's conversion gives NaN
        v = tl.where((u8 & 0x7F) == 0x7F, float("nan"), v)
    return v


@triton.jit
def e2m1_f16(c):
    """E2M1 codes (low 4 bits) -> fp16 holding value * 2^-14 (exact: the code's bits placed in fp16 fields)."""
    c16 = c.to(tl.uint16)
    return (((c16 & 7) << 9) | ((c16 & 8) << 12)).to(tl.float16, bitcast=True)


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
