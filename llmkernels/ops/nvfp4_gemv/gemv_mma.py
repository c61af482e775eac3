"""NVFP4 GEMV on integer tensor cores (mma.sync m16n8k32 s8): the decode is 7 instructions per 8 weights.

Twice an E2M1 value is an integer in [-12, 12], so every block sum (2a)(2b) is exact in int32 and an int8 mma
computes it. A warp owns 16 rows (R groups of them) and walks K in tiles of 16 scale blocks (256 values); thread
(g, t) of the warp (lane 4g + t) loads blocks 4t .. 4t + 3 of the tile from rows g and g + 8 (32 bytes a row: the
lane group reads whole 128-byte lines) and their four scale bytes. Each half-tile h (the thread's blocks 4t + 2h,
4t + 2h + 1) takes four mma steps c = 0..3: step c takes word c % 2 of block 4t + 2h + c // 2, in the A fragment
order (row g / g + 8, k slots 4t..4t+3 from its nibbles 0-3, 16+4t.. from 4-7). The mma's 8 output columns are
the half-tile's 8 blocks: the B fragment of step c is the b values of the block that column owns and zero
elsewhere, so after the 4 steps thread (g, t) holds the block sums C[g, 2t], C[g, 2t + 1], C[g + 8, 2t],
C[g + 8, 2t + 1] of exactly the blocks whose scales it loaded.

prmt looks 4 nibbles up at once in the byte table 2|e2m1| = 0 1 2 3 4 6 8 12; a code with the sign bit set hits
prmt's sign-replicate mode and gives 0 (the table's bytes have clear msbs). So the raw nibbles give the a >= 0
lanes, the nibbles with flipped sign bits the a < 0 lanes, and two mma per step sum a+ . b + a- . (-b).
The B fragments (b and -b, masked per step) are built once per tile and shared by the R row groups.

Under the Triton interpreter (no inline PTX) the same block sums come from plain integer arithmetic on the same
loads, and the rest of the kernel (masks, scales, PDL order, reductions) runs unchanged; tests/test_nvfp4_gemv.py
also runs the PTX below through a small emulator of its instructions.
"""
import torch
import triton
import triton.language as tl

from ..._runtime import interpreting, num_sms
from ..combine.kernel import pdl_enabled
from .kernel import _block_dot, _blocks, _e4m3_f32, _gdc_trigger, _gdc_wait, _reduce_kernel, gemv_launch

def _asm_bfrag() -> str:
    """$16: the int64 b block of this thread; $17, $18: masks (all ones or 0) of steps 0-1 and 2-3. Outputs, per
    step c: $4c, $4c+1 = the B fragment (int8 x4: nibbles 0-3, 4-7 of word c % 2) of 2b; $4c+2, $4c+3 = of -2b."""
    s = ("{\n.reg .b32 w<2>, x, p, n, u, m, sb<4>, nb<4>;\n"
         "mov.b32 m, 0x80808080;\nmov.b64 {w0, w1}, $16;\n")
    for word in range(2):
        for half in range(2):
            i = 2 * word + half
            s += (f"shr.b32 x, w{word}, 16;\n" if half else f"mov.b32 x, w{word};\n")
            s += ("prmt.b32 p, $19, $20, x;\n"          # |2b| where b >= 0, else 0
                  "xor.b32 x, x, 0x8888;\n"
                  "prmt.b32 n, $19, $20, x;\n"          # |2b| where b < 0, else 0
                  # bytewise: one of p, n is 0 and the other <= 12, so (0x80 - v) ^ 0x80 is -v in each byte
                  f"sub.u32 u, m, n;\nxor.b32 u, u, m;\nor.b32 sb{i}, p, u;\n"
                  f"sub.u32 u, m, p;\nxor.b32 u, u, m;\nor.b32 nb{i}, n, u;\n")
    for c in range(4):
        mask, word = ("$17" if c < 2 else "$18"), c % 2
        s += (f"and.b32 ${4 * c}, sb{2 * word}, {mask};\nand.b32 ${4 * c + 1}, sb{2 * word + 1}, {mask};\n"
              f"and.b32 ${4 * c + 2}, nb{2 * word}, {mask};\nand.b32 ${4 * c + 3}, nb{2 * word + 1}, {mask};\n")
    return s + "}"


def _asm_tile() -> str:
    """$4, $5: int64 blocks 2t and 2t + 1 of row g; $6, $7: of row g + 8; $8..$23: the B fragments of _asm_bfrag.
    Outputs $0..$3: the int32 block sums C[g, 2t], C[g, 2t + 1], C[g + 8, 2t], C[g + 8, 2t + 1]."""
    s = ("{\n.reg .b32 x<8>, z, s, r<4>;\n"
         "mov.b64 {x0, x1}, $4;\nmov.b64 {x2, x3}, $5;\nmov.b64 {x4, x5}, $6;\nmov.b64 {x6, x7}, $7;\n"
         "mov.b32 z, 0;\n")
    for c in range(4):
        top, bot = f"x{c}", f"x{4 + c}"
        for neg in range(2):
            acc = "z, z, z, z" if c == 0 and neg == 0 else "$0, $1, $2, $3"
            for j, word in enumerate((top, bot)):  # r0 / r1: nibbles 0-3 of row g / g + 8; r2 / r3: nibbles 4-7
                if neg:
                    s += f"xor.b32 s, {word}, 0x88888888;\nprmt.b32 r{j}, $24, $25, s;\nshr.b32 s, s, 16;\n"
                else:
                    s += f"prmt.b32 r{j}, $24, $25, {word};\nshr.b32 s, {word}, 16;\n"
                s += f"prmt.b32 r{2 + j}, $24, $25, s;\n"
            b0, b1 = 8 + 4 * c + 2 * neg, 9 + 4 * c + 2 * neg
            s += (f"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{$0, $1, $2, $3}}, {{r0, r1, r2, r3}}, "
                  f"{{${b0}, ${b1}}}, {{{acc}}};\n")
    return s + "}"


ASM_BFRAG = tl.constexpr(_asm_bfrag())
ASM_TILE = tl.constexpr(_asm_tile())


@triton.jit
def _ld(ptr, ok, MASK: tl.constexpr):
    if MASK:
        return tl.load(ptr, mask=ok, other=0)
    return tl.load(ptr)


@triton.jit
def _ld4(ptr, k, kb_hi, ok, MASK: tl.constexpr):
    """Elements k .. k + 3 at ptr (one vector load per thread: 32 bytes of weights, 4 of scales), as four [32 W]
    tensors (element e in thread e)."""
    j = tl.arange(0, 4)[None, :]
    v = _ld(ptr[:, None] + j, ok[:, None] & (k[:, None] + j < kb_hi), MASK)
    v02, v13 = tl.split(tl.reshape(v, [v.shape[0], 2, 2]))
    v0, v2 = tl.split(v02)
    v1, v3 = tl.split(v13)
    return v0, v1, v2, v3


@triton.jit
def _load_group(a_l, sa_l, row, kb0, kb_hi, M, s_am, s_sam, MASK_M: tl.constexpr, MASK_K: tl.constexpr):
    """Blocks kb0 .. kb0 + 3 of rows `row` and row + 8 (int64 words) and their scales (bytes). Masks only where the
    shape needs them (each masked load also zeroes its registers first)."""
    MASK: tl.constexpr = MASK_M or MASK_K
    at = a_l + row.to(tl.int64) * s_am + kb0
    st = sa_l + row.to(tl.int64) * s_sam + kb0
    return (_ld4(at, kb0, kb_hi, row < M, MASK), _ld4(at + 8 * s_am, kb0, kb_hi, row + 8 < M, MASK),
            _ld4(st, kb0, kb_hi, row < M, MASK), _ld4(st + 8 * s_sam, kb0, kb_hi, row + 8 < M, MASK))


@triton.jit
def _load_b(b_l, sb_l, kt0, kb0, bsel, kb_hi, MASK_K: tl.constexpr, USE_ASM: tl.constexpr):
    """Per tile (16 blocks from kt0): the b blocks of this thread's B fragments in its two half-tiles, sfb of its
    blocks kb0 .. kb0 + 3 and, under the interpreter, its own four b blocks."""
    ka = kt0 + bsel
    bb = (_ld(b_l + ka, ka < kb_hi, MASK_K), _ld(b_l + ka + 2, ka + 2 < kb_hi, MASK_K))
    sf = _ld4(sb_l + kb0, kb0, kb_hi, kb0 < kb_hi, MASK_K)
    if USE_ASM:
        own = sf
    else:
        own = _ld4(b_l + kb0, kb0, kb_hi, kb0 < kb_hi, MASK_K)
    return bb, sf, own


@triton.jit
def _half_math(x0, x1, x2, x3, frag, own0, own1, tab, USE_ASM: tl.constexpr):
    """Block sums of one half-tile: C[g, 2t], C[g, 2t + 1], C[g + 8, 2t], C[g + 8, 2t + 1] (int32)."""
    if USE_ASM:
        c = tl.inline_asm_elementwise(
            ASM_TILE, "=r,=r,=r,=r,l,l,l,l" + ",r" * 18,
            [x0, x1, x2, x3, frag[0], frag[1], frag[2], frag[3], frag[4], frag[5], frag[6], frag[7],
             frag[8], frag[9], frag[10], frag[11], frag[12], frag[13], frag[14], frag[15], tab[0], tab[1]],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:  # the interpreter: the same block sums from the thread's own b blocks
        c = (_block_dot(x0, own0, False), _block_dot(x1, own1, False), _block_dot(x2, own0, False),
             _block_dot(x3, own1, False))
    return c


@triton.jit
def _group_math(acc, q, fa, fb, own, f, tab, USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr):
    """Add one tile of one row group (loads q of _load_group) to its accumulators acc = (rows g, rows g + 8):
    block sums times sfa * sfb / 4, exact in fp32, so each addition rounds once."""
    xt, xb, st, sb = q
    c0, c1, c2, c3 = _half_math(xt[0], xt[1], xb[0], xb[1], fa, own[0], own[1], tab, USE_ASM)
    d0, d1, d2, d3 = _half_math(xt[2], xt[3], xb[2], xb[3], fb, own[2], own[3], tab, USE_ASM)
    at = acc[0] + c0.to(tl.float32) * (_e4m3_f32(st[0], FIX_NAN) * f[0])
    at = at + c1.to(tl.float32) * (_e4m3_f32(st[1], FIX_NAN) * f[1])
    at = at + d0.to(tl.float32) * (_e4m3_f32(st[2], FIX_NAN) * f[2])
    at = at + d1.to(tl.float32) * (_e4m3_f32(st[3], FIX_NAN) * f[3])
    ab = acc[1] + c2.to(tl.float32) * (_e4m3_f32(sb[0], FIX_NAN) * f[0])
    ab = ab + c3.to(tl.float32) * (_e4m3_f32(sb[1], FIX_NAN) * f[1])
    ab = ab + d2.to(tl.float32) * (_e4m3_f32(sb[2], FIX_NAN) * f[2])
    ab = ab + d3.to(tl.float32) * (_e4m3_f32(sb[3], FIX_NAN) * f[3])
    return at, ab


@triton.jit
def _load_w(a_l, sa_l, row, kb0, kb_hi, M, s_am, s_sam, R: tl.constexpr, MASK_M: tl.constexpr,
            MASK_K: tl.constexpr):
    """_load_group for each of the R row groups (unused groups repeat group 0's loads; never consumed)."""
    q0 = _load_group(a_l, sa_l, row, kb0, kb_hi, M, s_am, s_sam, MASK_M, MASK_K)
    q1 = q0
    q2 = q0
    q3 = q0
    if R > 1:
        q1 = _load_group(a_l, sa_l, row + 16, kb0, kb_hi, M, s_am, s_sam, MASK_M, MASK_K)
    if R > 2:
        q2 = _load_group(a_l, sa_l, row + 32, kb0, kb_hi, M, s_am, s_sam, MASK_M, MASK_K)
    if R > 3:
        q3 = _load_group(a_l, sa_l, row + 48, kb0, kb_hi, M, s_am, s_sam, MASK_M, MASK_K)
    return q0, q1, q2, q3


@triton.jit
def _frag(bb, m0, m1, tab):
    return tl.inline_asm_elementwise(ASM_BFRAG, "=r" + ",=r" * 15 + ",l,r,r,r,r", [bb, m0, m1, tab[0], tab[1]],
                                     dtype=(tl.int32,) * 16, is_pure=True, pack=1)


@triton.jit
def _tile_math(accs, qs, bl, m0, m1, tab, R: tl.constexpr, USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr):
    """One tile for all R row groups: the B fragments of its two half-tiles are built once for them."""
    bb, sf, own = bl
    f = (_e4m3_f32(sf[0], FIX_NAN) * 0.25, _e4m3_f32(sf[1], FIX_NAN) * 0.25, _e4m3_f32(sf[2], FIX_NAN) * 0.25,
         _e4m3_f32(sf[3], FIX_NAN) * 0.25)
    if USE_ASM:
        fa = _frag(bb[0], m0, m1, tab)
        fb = _frag(bb[1], m0, m1, tab)
    else:
        fa = (m0,) * 16
        fb = fa
    a0 = _group_math(accs[0], qs[0], fa, fb, own, f, tab, USE_ASM, FIX_NAN)
    a1, a2, a3 = accs[1], accs[2], accs[3]
    if R > 1:
        a1 = _group_math(a1, qs[1], fa, fb, own, f, tab, USE_ASM, FIX_NAN)
    if R > 2:
        a2 = _group_math(a2, qs[2], fa, fb, own, f, tab, USE_ASM, FIX_NAN)
    if R > 3:
        a3 = _group_math(a3, qs[3], fa, fb, own, f, tab, USE_ASM, FIX_NAN)
    return a0, a1, a2, a3


@triton.jit
def _store_rows(acc, rows, l, M, W: tl.constexpr, alpha, out_ptr, part_ptr, split, L, s_ol, s_om,
                PARTIAL: tl.constexpr):
    """Sum a [32 W] accumulator over the 4 threads of each lane group and over the W warps: 8 row sums."""
    tot = tl.sum(tl.sum(tl.reshape(acc, [W, 8, 4]), axis=2), axis=0)
    ok = rows < M
    if PARTIAL:  # split K: fp32 partials, reduced in a fixed order by _reduce_kernel
        tl.store(part_ptr + (split * L + l) * M + rows, tot, mask=ok)
    else:
        tl.store(out_ptr + l * s_ol + rows * s_om, (tot * alpha).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["one"])
def _gemv_mma_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, part_ptr, alpha,
                     M, L, KB, per_split, one,
                     s_al, s_am, s_sal, s_sam, s_bl, s_sbl, s_ol, s_om,
                     R: tl.constexpr, W: tl.constexpr, MASK_M: tl.constexpr, MASK_K: tl.constexpr,
                     PARTIAL: tl.constexpr, USE_ASM: tl.constexpr, FIX_NAN: tl.constexpr, USE_GDC: tl.constexpr,
                     PRE: tl.constexpr, TRIGGER: tl.constexpr, EMIT: tl.constexpr):
    """Rows pid * 16R .. + 16R - 1 of batch l over the blocks of `split`; the W warps take the K tiles (16 blocks)
    in turn (warp w: tiles w, w + W, ...) and their sums meet at the end. a_ptr int64 [L, M, KB] (one scale block a
    word), b_ptr int64 [L, KB], sa_ptr / sb_ptr bytes with unit stride along K.

    Element e of the [32 W] tensors lives in lane e % 32 of warp e // 32 (the fragment order of the PTX): Triton's
    layout for a 1-D tensor of 32 W elements over W warps as long as no address looks contiguous, which the
    runtime `one` (= 1, not specialised) sees to. USE_GDC (programmatic dependent launch, static weights): the
    weights of the first tile (PRE) are loaded before griddepcontrol.wait, b and everything stored after it;
    TRIGGER 3 releases the next kernel at entry, 1 after the wait, 0 never (it starts when this grid ends).
    MASK_M / MASK_K: rows past M / blocks past a split's end can occur (else every load is unmasked)."""
    if USE_GDC:
        if TRIGGER == 3:
            _gdc_trigger(EMIT)
    pid = tl.program_id(0)
    l = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    e = tl.arange(0, 32 * W)
    g = (e % 32) // 4
    t = (e % 4) * one
    w = (e // 32) * one
    kb_lo = split * per_split
    kb_hi = tl.minimum(kb_lo + per_split, KB)
    n_iter = tl.cdiv(tl.cdiv(kb_hi - kb_lo, 16), W)
    row = pid * (16 * R) + g  # top row of group 0; group r adds 16 r
    a_l = a_ptr + l * s_al
    sa_l = sa_ptr + l * s_sal
    b_l = b_ptr + l * s_bl
    sb_l = sb_ptr + l * s_sbl
    # half-tile h holds the thread's blocks 4t + 2h, 4t + 2h + 1 in mma columns 2t, 2t + 1: column g of half h is
    # block 4 (g // 2) + g % 2 + 2h, and only the lane with g // 2 = t carries b there (masks m0: steps 0-1, m1: 2-3)
    bsel = (4 * (g // 2) + g % 2) * one
    m0 = tl.where(g == 2 * t, -1, 0)
    m1 = tl.where(g == 2 * t + 1, -1, 0)
    # prmt tables (2|e2m1| of codes 0-3 | 4-7) as runtime values: as immediates ptxas re-creates them per use
    tab = (0x03020100 * one + 0 * e, 0x0C080604 * one + 0 * e)
    z = tl.zeros([32 * W], tl.float32)
    accs = ((z, z), (z, z), (z, z), (z, z))
    kt0 = kb_lo + 16 * w  # this warp's first tile; thread t takes its blocks 4t .. 4t + 3
    i0 = 0
    if USE_GDC:
        if PRE:  # the first tile's weights may be read while the preceding kernel still runs
            qs = _load_w(a_l, sa_l, row, kt0 + 4 * t, kb_hi, M, s_am, s_sam, R, MASK_M, MASK_K)
        _gdc_wait(EMIT)
        if TRIGGER == 1:
            _gdc_trigger(EMIT)
        if PRE:
            accs = _tile_math(accs, qs, _load_b(b_l, sb_l, kt0, kt0 + 4 * t, bsel, kb_hi, MASK_K, USE_ASM), m0, m1,
                              tab, R, USE_ASM, FIX_NAN)
            i0 = 1
    for i in range(i0, n_iter):
        kt = kb_lo + 16 * (i * W + w)
        qs = _load_w(a_l, sa_l, row, kt + 4 * t, kb_hi, M, s_am, s_sam, R, MASK_M, MASK_K)
        accs = _tile_math(accs, qs, _load_b(b_l, sb_l, kt, kt + 4 * t, bsel, kb_hi, MASK_K, USE_ASM), m0, m1, tab,
                          R, USE_ASM, FIX_NAN)
    r8 = pid * (16 * R) + tl.arange(0, 8)
    for r in tl.static_range(R):
        _store_rows(accs[r][0], r8 + 16 * r, l, M, W, alpha, out_ptr, part_ptr, split, L, s_ol, s_om, PARTIAL)
        _store_rows(accs[r][1], r8 + 16 * r + 8, l, M, W, alpha, out_ptr, part_ptr, split, L, s_ol, s_om, PARTIAL)


# ---- host side -------------------------------------------------------------------------------------

TRIGGERS = {"none": 0, "wait": 1, "entry": 3}


def mma_usable(device: torch.device) -> bool:
    """mma.sync m16n8k32 on int8 and prmt: sm_80 and newer; not under the interpreter (its PTX cannot run)."""
    return (not interpreting() and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (8, 0))


def mma_plan(M: int, KB: int, L: int, device: torch.device, static_weights: bool = False, R: int = 4,
             W: int = 4) -> dict:
    """R row groups of 16 per warp (the B fragments are shared by them), W warps splitting K, and a K split over
    programs only when the row tiles cannot fill the GPU. static_weights: programmatic dependent launch with the
    first tile's weights loaded before the wait and the next call released at entry."""
    tiles = -(-M // (16 * R)) * L
    sms = num_sms(device)
    split = 1 if tiles >= sms else min(-(-2 * sms // tiles), max(1, -(-KB // (16 * W))))
    plan = dict(R=R, W=W, split=split)
    if static_weights:
        plan.update(pdl=True, pre=1, trigger="entry")
    return plan


def gemv_mma_launch(a64, b64, sa8, sb8, out, alpha: float, cfg: dict, use_asm=None):
    """a64 int64 [L, M, KB] and b64 int64 [L, KB] (one scale block a word, unit stride along KB); sa8 uint8
    [M, KB, L], sb8 uint8 [KB, L] (unit stride along KB); out fp16 [M, 1, L]. cfg: R, W, split (mma_plan) and the
    PDL keys pdl / pre / trigger (see gemv_launch's contract: with pdl, a and sfa must not be written by a kernel
    that may still be running)."""
    L, M, KB = a64.shape
    if sa8.stride(1) != 1:  # the kernel steps through scales bytewise along K
        sa8 = sa8.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    if sb8.stride(0) != 1:
        sb8 = sb8.t().contiguous().t()
    R, W = int(cfg["R"]), int(cfg["W"])
    if not (1 <= R <= 4 and W >= 1 and W & (W - 1) == 0):
        raise ValueError(f"mma GEMV config needs 1 <= R <= 4 and W a power of two, got {cfg}")
    per = -(-(-(-KB // int(cfg.get("split", 1)))) // 16) * 16  # blocks per split: whole tiles
    split = -(-KB // per)
    interp = interpreting()
    order = bool(cfg.get("pdl", False)) and (interp or pdl_enabled(a64.device))
    pdl = order and not interp
    part = torch.empty(split, L, M, dtype=torch.float32, device=a64.device) if split > 1 else out
    if use_asm is None:
        use_asm = not interp
    _gemv_mma_kernel[(triton.cdiv(M, 16 * R), L, split)](
        a64, sa8, b64, sb8, out, part, alpha if split == 1 else 1.0, M, L, KB, per, 1,
        a64.stride(0), a64.stride(1), sa8.stride(2), sa8.stride(0), b64.stride(0), sb8.stride(1),
        out.stride(2), out.stride(0),
        R=R, W=W, MASK_M=M % (16 * R) != 0, MASK_K=KB % (16 * W) != 0 or per % (16 * W) != 0, PARTIAL=split > 1, USE_ASM=use_asm, FIX_NAN=interp, USE_GDC=order,
        PRE=int(cfg.get("pre", 1)) if order else 0, TRIGGER=TRIGGERS[cfg.get("trigger", "entry")] if order else 0,
        EMIT=pdl, num_warps=W, **({"launch_pdl": True} if pdl else {}))
    if split > 1:
        blk = 256
        _reduce_kernel[(triton.cdiv(M, blk), L)](part, out, part, part, alpha, L, M, out.stride(2), out.stride(0),
                                                 SPLIT=split, BLOCK=blk, HAS_SCALE_PTR=False, HAS_BIAS=False,
                                                 USE_GDC=pdl, **({"launch_pdl": True} if pdl else {}))
    return out


def launch_gemv(a8, b8, sa8, sb8, out, alpha: float, cfg=None, static_weights: bool = False):
    """The GEMV entry of the op: a8 uint8 [M, K/2, L], b8 [N, K/2, L] (row 0 used), sa8 / sb8 uint8 [., K/16, L],
    out fp16 [M, 1, L]. On sm_80+ GPUs the tensor-core kernel above (cfg of mma_plan); elsewhere, under the
    interpreter and for scales that are not unit-stride along K, kernel.gemv_launch (cfg of gemv_plan)."""
    M, KH, L = a8.shape
    KB = KH // 8
    if M == 0 or L == 0:
        return out
    if KB == 0:
        return out.zero_()
    sb0 = sb8[0]
    mma = "R" in cfg if cfg is not None else mma_usable(a8.device) and sa8.stride(1) == 1 and sb0.stride(0) == 1
    if not mma:
        return gemv_launch(a8, b8, sa8, sb8, out, alpha, cfg=cfg, static_weights=static_weights)
    cfg = cfg or mma_plan(M, KB, L, a8.device, static_weights)
    return gemv_mma_launch(_blocks(a8), _blocks(b8[:1])[:, 0], sa8, sb0, out, alpha, cfg)
