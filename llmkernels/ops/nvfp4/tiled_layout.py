"""The tiled NVFP4 weight layout (what NVFP4Linear stores where out_features % 16 == 0 and in_features %
256 == 0): each mma-kernel warp's weight words and scales lie contiguous in memory, 512 bytes a step, so a load
instruction reads four whole 128-byte lines (the plain layout gives 8 rows x 32 bytes) and a warp streams one
contiguous range. Measured on the H100: 1.12-1.6x the plain-layout kernel (notes/nvfp4_gemv.md, linear round 13).
This module: the layout (tile / untile, the bit permutation), the pair-decode recipes in PTX, and the dequantize
kernel; the mma kernel is tiled.py, the prefill kernel tiled_prefill.py.

Layout, for 16-row block b and 8-byte weight word w (16 E2M1 codes: one scale block) of row r = 16 b + g + 8 h:
packed (uint8 [N, K/2], the same bytes reordered) holds word [b, w // 4, 4 g + w % 4, h] of an int64
[N/16, K/64, 32, 2] array (the 32 = the mma lanes: lane 4 g + c takes words c, c + 4, ... of rows g and g + 8);
scales (e4m3 [N, K/16]) hold byte [b, w // 16, 4 g + w % 4, 2 ((w // 4) % 4) + h] of [N/16, K/256, 32, 8] (a lane's
scales for 4 steps in one 8-byte word).

Within a word the bits are permuted too (code_bits): pair p of the block's 16 codes (codes 2p, 2p + 1) lies where a
funnel shift and an AND (pairs 0-5) or an AND, a multiply and an AND (pairs 6, 7) move it into the bf16x2 fields
[mantissa msb 6, exponent lsbs 7-8, sign 15] of each half, where it reads as E2M1 x 2^-126: 2-3 operations a pair
instead of the byte-table decode's ~10 (notes/nvfp4_gemv.md, linear round 15)."""
import functools

import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._runtime import cdiv, interpreting
from .common import e2m1_f16, e4m3_f32

TILE_N, TILE_K = 16, 256


def tileable(N: int, K: int) -> bool:
    return N > 0 and K > 0 and N % TILE_N == 0 and K % TILE_K == 0


def _u8(t):
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# pair p < 6 sits at the bf16x2 fields' bits rotated by _SHIFT[p] within the 64-bit word (kernel: shf.r + and)
_SHIFT = (0, 3, 6, 32, 35, 38)
_FIELDS = (6, 7, 8, 15)  # bf16 bits of E2M1 x 2^-126: mantissa msb, the exponent's two lsbs, sign
_REST = (3, 4, 0, 1)  # pairs 6, 7: (w & 0x001B001B) * (2^3 + 2^8 + 2^14) carries these to _FIELDS without overlap
REST_MASK, REST_MUL, PAIR_MASK = 0x001B001B, (1 << 3) + (1 << 8) + (1 << 14), 0x81C081C0
_C_REST_MASK, _C_REST_MUL, _C_PAIR_MASK = tl.constexpr(REST_MASK), tl.constexpr(REST_MUL), tl.constexpr(PAIR_MASK)


def code_bits(k: int):
    """The word bits holding code k's bits 0-3 (magnitude lsb .. sign) in the tiled layout."""
    p, c = divmod(k, 2)
    if p < 6:
        return tuple((b + 16 * c + _SHIFT[p]) % 64 for b in _FIELDS)
    return tuple(b + 16 * c + 32 * (p - 6) for b in _REST)


@functools.lru_cache(maxsize=None)
def _bit_tables(inverse: bool, device: torch.device) -> torch.Tensor:
    """[8, 256] int64: the permuted word's part from each byte value at each byte position (or the inverse)."""
    dst = [b for k in range(16) for b in code_bits(k)]  # plain bit 4k + i -> dst[4k + i]
    if inverse:
        dst = [dst.index(b) for b in range(64)]
    tab = [[sum(1 << dst[8 * j + i] for i in range(8) if v >> i & 1) for v in range(256)] for j in range(8)]
    return torch.tensor([[t - (1 << 64) if t >> 63 else t for t in row] for row in tab], dtype=torch.int64,
                        device=device)


def _permute_bits(words: torch.Tensor, inverse: bool) -> torch.Tensor:
    tab = _bit_tables(inverse, words.device)
    b = words.view(torch.uint8).view(*words.shape, 8)
    out = tab[0][b[..., 0].long()]
    for j in range(1, 8):
        out |= tab[j][b[..., j].long()]
    return out


def tile_packed(packed: torch.Tensor) -> torch.Tensor:
    """Plain [N, K/2] packed codes (uint8 or float4_e2m1fn_x2) -> the tiled layout, same shape and dtype."""
    N, KH = packed.shape
    w = _permute_bits(_u8(packed).contiguous().view(torch.int64), False).view(N // 16, 2, 8, KH // 32, 4)  # b h g j c
    return w.permute(0, 3, 2, 4, 1).contiguous().view(torch.uint8).view(N, KH).view(packed.dtype)


def untile_packed(packed: torch.Tensor) -> torch.Tensor:
    N, KH = packed.shape
    w = _u8(packed).contiguous().view(torch.int64).view(N // 16, KH // 32, 8, 4, 2)  # b, j, g, c, h
    w = _permute_bits(w.permute(0, 4, 2, 1, 3).contiguous(), True)
    return w.view(torch.uint8).view(N, KH).view(packed.dtype)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """Plain [N, K/16] e4m3 scales -> the tiled layout, same shape and dtype."""
    N, KS = scales.shape
    s = _u8(scales).contiguous().view(N // 16, 2, 8, KS // 16, 4, 4)  # b, h, g, i, u, c
    return s.permute(0, 3, 2, 5, 4, 1).contiguous().view(N, KS).view(scales.dtype)


def untile_scales(scales: torch.Tensor) -> torch.Tensor:
    N, KS = scales.shape
    s = _u8(scales).contiguous().view(N // 16, KS // 16, 8, 4, 4, 2)  # b, i, g, c, u, h
    return s.permute(0, 5, 2, 1, 4, 3).contiguous().view(N, KS).view(scales.dtype)


def _asm_pair(lo: str, hi: str, p: int, dst: str, bf16: bool, sc: str) -> str:
    """PTX: pair p of the word in registers lo, hi (code_bits) -> dst, two values e2m1 x scale x 2^-7 (bf16 or fp16)
    for sc = scale x 2^119 (bf16) or x 2^7 (fp16) in both halves; clobbers t (fp16)."""
    if p in (0, 3):
        out = f"and.b32 {dst}, {lo if p == 0 else hi}, {PAIR_MASK:#x};\n"
    elif p < 6:
        a, b = (lo, hi) if p < 3 else (hi, lo)
        out = f"shf.r.wrap.b32 {dst}, {a}, {b}, {_SHIFT[p] % 32};\nand.b32 {dst}, {dst}, {PAIR_MASK:#x};\n"
    else:
        out = (f"and.b32 {dst}, {lo if p == 6 else hi}, {REST_MASK:#x};\nmul.lo.u32 {dst}, {dst}, {REST_MUL};\n"
               f"and.b32 {dst}, {dst}, {PAIR_MASK:#x};\n")
    if not bf16:  # magnitude bits 6-8 -> 9-11, sign stays: (x << 3 | x) & 0x8E008E00
        out += f"shl.b32 t, {dst}, 3;\nlop3.b32 {dst}, t, {dst}, 0x8E008E00, 0xA8;\n"
    return out + f"mul.rn.{'bf16' if bf16 else 'f16'}x2 {dst}, {dst}, {sc};\n"


def asm_chunk(j: int, dsts, bf16: bool) -> str:
    """PTX: k16 chunk j's A fragment (dsts = a0..a3: rows g / g + 8 of pair 2j, then of pair 2j + 1) from the words
    in lo0 / hi0 (row g) and lo1 / hi1 (row g + 8), scales sc0 / sc1 (_asm_pair)."""
    return "".join(_asm_pair(f"lo{r}", f"hi{r}", p, d, bf16, f"sc{r}")
                   for (r, p), d in zip(((0, 2 * j), (1, 2 * j), (0, 2 * j + 1), (1, 2 * j + 1)), dsts))


def _asm_word(bf16: bool) -> str:
    """A whole word ($8, int64) and its scale ($9, 16-bit, as _asm_pair wants it) -> its 8 pairs ($0..$7)."""
    return ("{\n.reg .b32 lo, hi, sc, t;\nmov.b64 {lo, hi}, $8;\nmov.b32 sc, {$9, $9};\n"
            + "".join(_asm_pair("lo", "hi", p, f"${p}", bf16, "sc") for p in range(8)) + "}")


ASM_WORD_BF16 = tl.constexpr(_asm_word(True))
ASM_WORD_F16 = tl.constexpr(_asm_word(False))


@triton.jit
def _pair_codes(word, p: tl.constexpr):
    """Codes 2p and 2p + 1 of int64 words in the tiled layout, by the mma kernel's decode (pair -> bf16 fields)."""
    u = word.to(tl.uint64, bitcast=True)
    if p < 6:
        sh: tl.constexpr = (p // 3) * 32 + (p % 3) * 3
        if sh:
            u = (u >> sh) | (u << (64 - sh))
        f = (u & _C_PAIR_MASK).to(tl.int32)
    else:
        f = ((((u >> (32 * (p - 6))) & _C_REST_MASK) * _C_REST_MUL) & _C_PAIR_MASK).to(tl.int32)
    return ((f >> 6) & 7) | ((f >> 12) & 8), ((f >> 22) & 7) | ((f >> 28) & 8)


@triton.jit
def _join16(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15):
    """16 tensors -> one with 4 more axes of 2, value k at [k // 8, k // 4 % 2, k // 2 % 2, k % 2] (joins k with
    k + 8, then + 4, + 2, + 1), so a reshape puts the 16 side by side in order."""
    a0, a1, a2, a3 = tl.join(c0, c8), tl.join(c1, c9), tl.join(c2, c10), tl.join(c3, c11)
    a4, a5, a6, a7 = tl.join(c4, c12), tl.join(c5, c13), tl.join(c6, c14), tl.join(c7, c15)
    b0, b1, b2, b3 = tl.join(a0, a4), tl.join(a1, a5), tl.join(a2, a6), tl.join(a3, a7)
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def _tiled_words(w_ptr, s_ptr, r, kw, N, KW):
    """Words kw [1, BKW] (16 codes each) of rows r [BN, 1] in the tiled layout (int64) and their scale bytes; 0 past
    N."""
    ok = (r < N) & (kw < KW)
    r64 = r.to(tl.int64)
    lane = 4 * (r64 % 8) + kw % 4
    h = (r64 % 16) // 8
    word = tl.load(w_ptr + ((r64 // 16) * (KW // 4) + kw // 4) * 64 + lane * 2 + h, mask=ok, other=0)
    sc = tl.load(s_ptr + (((r64 // 16) * (KW // 16) + kw // 16) * 32 + lane) * 8 + 2 * ((kw // 4) % 4) + h,
                 mask=ok, other=0)
    return word, sc


@triton.jit
def tiled_values(w_ptr, s_ptr, r, kw, N, KW, mul, BN: tl.constexpr, BKW: tl.constexpr, FIX_NAN: tl.constexpr):
    """[BN, 16 BKW] fp32: e2m1 * (scale * mul) of rows r [BN, 1] x words kw [1, BKW] in the tiled layout (0 past
    N), a word (16 codes) at a time."""
    word, sc = _tiled_words(w_ptr, s_ptr, r, kw, N, KW)
    sc = e4m3_f32(sc, FIX_NAN) * (16384.0 * mul)
    c0, c1 = _pair_codes(word, 0)
    c2, c3 = _pair_codes(word, 1)
    c4, c5 = _pair_codes(word, 2)
    c6, c7 = _pair_codes(word, 3)
    c8, c9 = _pair_codes(word, 4)
    c10, c11 = _pair_codes(word, 5)
    c12, c13 = _pair_codes(word, 6)
    c14, c15 = _pair_codes(word, 7)
    c = _join16(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15)
    return tl.reshape(e2m1_f16(c).to(tl.float32) * sc[:, :, None, None, None, None], [BN, 16 * BKW])


@triton.jit
def _dequant_tiled_kernel(w_ptr, s_ptr, gs_ptr, out_ptr, N, KW, s_on, BN: tl.constexpr, BKW: tl.constexpr,
                          FIX_NAN: tl.constexpr):
    """out [N, 16 KW] = e2m1 * scale * gs from the tiled layout; the values computed as linear._dequant_kernel
    computes them (bitwise equal)."""
    r = tl.program_id(0) * BN + tl.arange(0, BN)[:, None]
    kw = tl.program_id(1) * BKW + tl.arange(0, BKW)[None, :]
    v = tiled_values(w_ptr, s_ptr, r, kw, N, KW, tl.load(gs_ptr), BN, BKW, FIX_NAN)
    cols = tl.program_id(1) * (16 * BKW) + tl.arange(0, 16 * BKW)[None, :]
    tl.store(out_ptr + r.to(tl.int64) * s_on + cols, v.to(out_ptr.dtype.element_ty), mask=(r < N) & (cols < 16 * KW))


def dequant_tiled_launch(w8, s8, gs, out):
    """w8 / s8 in the tiled layout (uint8, contiguous) -> out [N, K] (linear.dequant_launch's values)."""
    N, KH = w8.shape
    if N == 0 or KH == 0:
        return out
    BN, BKW = 16, 16
    launch(_dequant_tiled_kernel, (cdiv(N, BN), cdiv(KH // 8, BKW)), w8.contiguous().view(torch.int64),
           s8.contiguous(), gs, out, N, KH // 8, out.stride(0), BN=BN, BKW=BKW, FIX_NAN=interpreting(), num_warps=4)
    return out

