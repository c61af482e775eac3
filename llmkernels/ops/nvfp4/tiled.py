"""NVFP4 linear on the tiled weight layout (tiled_layout.py: what NVFP4Linear stores where out_features % 16 == 0
and in_features % 256 == 0): the register-fed mma kernel for 1-16 tokens and its planner. Each warp's weight words
and scales lie contiguous, 512 bytes a step, so a load reads four whole 128-byte lines and a warp streams one
contiguous range (H100: 1.12-1.6x the plain-layout kernel, notes/nvfp4_gemv.md, linear round 13)."""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._launch import Launch, launch
from ..._runtime import capability, cdiv, interpreting, planned_sms
from ..._pdl import pdl_enabled, pdl_enter
from .common import asm_mma_tokens, e4m3_f32
from .linear import MMA_MAX_T, _mma_acts, _store_out
from .tiled_layout import TILE_K, TILE_N, _u8, asm_chunk


def _asm_mma_tiled(bf16: bool, nt: int = 1) -> str:
    """One thread's 4 mma.m16n8k16 of a step over nt groups of 8 tokens, weights in the tiled layout. Operands
    (A = 4 nt): accumulators $0..$A-1 (tied to $A..$2A-1); the words of rows r ($2A) and r + 8 ($2A+1); their
    scales ($2A+2, $2A+3: 16-bit, times 2^119 (bf16) or 2^7 (fp16)); per token group its 4 activation words. Pair p
    of a word (code_bits) becomes E2M1 x 2^-126 in bf16 fields: lo & PAIR_MASK, a funnel shift first (pairs 1-2, 4-5),
    or (w & REST_MASK) * REST_MUL (pairs 6-7: the word half's leftover bits, moved without carries); fp16 moves the
    magnitudes 3 bits up (E2M1 x 2^-14). Times the scale: E2M1 x scale x 2^-7, exact (<= 6 significant bits, normal
    range); the store multiplies by 2^7. mma j takes pairs 2j (k 2t, 2t + 1) and 2j + 1 (k 2t + 8, 2t + 9) and
    activation word j, as before the bits moved."""
    na = 4 * nt
    wt, wb, st, sb = 2 * na, 2 * na + 1, 2 * na + 2, 2 * na + 3
    ty = "bf16" if bf16 else "f16"
    s = ("{\n.reg .b32 lo<2>, hi<2>, a<4>, b<2>, sc<2>, t;\n"
         f"mov.b64 {{lo0, hi0}}, ${wt};\nmov.b64 {{lo1, hi1}}, ${wb};\n"
         f"mov.b32 sc0, {{${st}, ${st}}};\nmov.b32 sc1, {{${sb}, ${sb}}};\n")

    for j in range(4):
        s += asm_chunk(j, ("a0", "a1", "a2", "a3"), bf16) + asm_mma_tokens(ty, nt, 2 * na + 4 + j)
    return s + "}"


ASM_TILED_BF16 = tl.constexpr(_asm_mma_tiled(True))
ASM_TILED_F16 = tl.constexpr(_asm_mma_tiled(False))
ASM_TILED2_BF16 = tl.constexpr(_asm_mma_tiled(True, 2))
ASM_TILED2_F16 = tl.constexpr(_asm_mma_tiled(False, 2))


@triton.jit
def _tiled_issue(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7,
                 DT: tl.constexpr, NT: tl.constexpr):
    if NT == 2:
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = tl.inline_asm_elementwise(
            ASM_TILED2_BF16 if DT == tl.bfloat16 else ASM_TILED2_F16,
            "=f,=f,=f,=f,=f,=f,=f,=f,0,1,2,3,4,5,6,7,l,l,h,h,l,l,l,l,l,l,l,l",
            [acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7],
            dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
            ASM_TILED_BF16 if DT == tl.bfloat16 else ASM_TILED_F16, "=f,=f,=f,=f,0,1,2,3,l,l,h,h,l,l,l,l",
            [acc0, acc1, acc2, acc3, wt, wb, st, sb, x0, x1, x2, x3], dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _ld_pair(p):
    """Two weight words (rows g and g + 8) at p: 16 bytes, read-only path."""
    return tl.inline_asm_elementwise("ld.global.nc.v2.b64 {$0, $1}, [$2];", "=l,=l,l", [p.to(tl.int64, bitcast=True)],
                                     dtype=(tl.int64, tl.int64), is_pure=True, pack=1)


@triton.jit
def _ld_word(p):
    return tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [p.to(tl.int64, bitcast=True)],
                                     dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def _ld_iter(pw, ps):
    """An iteration's scale word and its 4 steps' word pairs."""
    sv = _ld_word(ps)
    w0t, w0b = _ld_pair(pw)
    w1t, w1b = _ld_pair(pw + 64)
    w2t, w2b = _ld_pair(pw + 128)
    w3t, w3b = _ld_pair(pw + 192)
    return sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b


@triton.jit
def _store_sum(acc, row, t, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R: tl.constexpr,
               KS: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr):
    """The sum of one accumulator over the KS warps that split K ([32 R KS] -> [R, 32], in shared memory), stored by
    the plain kernel's _store_out (scale, bias, masks). GLU: the R blocks alternate between the parts (gs / bias,
    gs1 / b1): silu(part 0) * part 1 in fp32, rounded once, at rows `row` [R / 2, 32] < N / 2 of y."""
    if KS == 1:
        v = tl.reshape(acc, [R, 32])
    else:
        v = tl.sum(tl.reshape(acc, [R, KS, 32]), axis=1)
    if GLU:
        a, b = tl.split(tl.permute(tl.reshape(v, [R // 2, 2, 32]), (0, 2, 1)))
        off = row * one
        ok = row < N // 2
        a = a * (128.0 * tl.load(gs_ptr))  # the decode's 2^-7 (exact) and the global scale
        b = b * (128.0 * tl.load(gs1_ptr))
        if HAS_BIAS:
            a += tl.load(bias_ptr + off, mask=ok, other=0.0).to(tl.float32)
            b += tl.load(b1_ptr + off, mask=ok, other=0.0).to(tl.float32)
        h = a / (1.0 + tl.exp(-a)) * b
        tl.store(y_ptr + t * s_yt + off, h.to(y_ptr.dtype.element_ty), mask=ok & (t < T))
    else:
        v = v * 128.0  # the decode's 2^-7 (exact)
        _store_out(v, row, t, 0, T, N, gs_ptr, bias_ptr, y_ptr, y_ptr, s_yt, one, False, HAS_BIAS)


@triton.jit
def _tiled_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, sv, u: tl.constexpr, px0, px1,
                DT: tl.constexpr, NT: tl.constexpr, WIDE: tl.constexpr):
    """Step u of an iteration: words wt / wb, their scales in bytes 2u / 2u + 1 of sv (times 2^119 in bf16, 2^7 in
    fp16: exact, as the decode wants), the activations at px + 16u (WIDE: two 16-byte loads, else four 8-byte)."""
    if DT == tl.bfloat16:
        up = 6.646139978924579e35  # 2^119
    else:
        up = 128.0
    st = (e4m3_f32(((sv >> (16 * u)) & 0xFF).to(tl.uint8), False) * up).to(DT)
    sb = (e4m3_f32(((sv >> (16 * u + 8)) & 0xFF).to(tl.uint8), False) * up).to(DT)
    if WIDE:
        x0, x1 = _ld_pair(px0 + 16 * u)
        x2, x3 = _ld_pair(px0 + 16 * u + 2)
    else:
        x0, x1, x2, x3 = _mma_acts(px0 + 16 * u, True, 1)
    x4, x5, x6, x7 = x0, x1, x2, x3
    if NT == 2:
        if WIDE:
            x4, x5 = _ld_pair(px1 + 16 * u)
            x6, x7 = _ld_pair(px1 + 16 * u + 2)
        else:
            x4, x5, x6, x7 = _mma_acts(px1 + 16 * u, True, 1)
    return _tiled_issue(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6,
                        x7, DT, NT)


@triton.jit
def _tiled_iter(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b, sv, px0, px1,
                DT: tl.constexpr, NT: tl.constexpr, WIDE: tl.constexpr):
    """One iteration (4 steps, words loaded by _ld_iter) of the mma over NT groups of 8 token columns."""
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w0t, w0b, sv, 0, px0, px1, DT, NT, WIDE)
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w1t, w1b, sv, 1, px0, px1, DT, NT, WIDE)
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w2t, w2b, sv, 2, px0, px1, DT, NT, WIDE)
    return _tiled_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w3t, w3b, sv, 3, px0, px1, DT, NT, WIDE)


@triton.jit
def _tiled_keep(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, b0, b1, b2, b3, b4, b5, b6, b7, keep,
                EVEN: tl.constexpr, NT: tl.constexpr):
    """The accumulators after an iteration, or before it (b*) where it lies past the warp's short range."""
    if not EVEN:
        acc0, acc1, acc2, acc3 = (tl.where(keep, acc0, b0), tl.where(keep, acc1, b1), tl.where(keep, acc2, b2),
                                  tl.where(keep, acc3, b3))
        if NT == 2:
            acc4, acc5, acc6, acc7 = (tl.where(keep, acc4, b4), tl.where(keep, acc5, b5), tl.where(keep, acc6, b6),
                                      tl.where(keep, acc7, b7))
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _gdc_wait_after(a, b, c, d, e, f, g, h, i):
    """griddepcontrol.wait after the loads of a..i have landed: ptxas hoists a bare wait above earlier loads, not
    one predicated on their data (taken either way, p or !p)."""
    return tl.inline_asm_elementwise("{\n.reg .b64 t;\n.reg .pred p;\nxor.b64 t, $1, $2;\nxor.b64 t, t, $3;\n"
                                     "xor.b64 t, t, $4;\nxor.b64 t, t, $5;\nxor.b64 t, t, $6;\nxor.b64 t, t, $7;\n"
                                     "xor.b64 t, t, $8;\nxor.b64 t, t, $9;\nsetp.eq.b64 p, t, 0x5A5A5A5A5A5A5A5A;\n"
                                     "@p griddepcontrol.wait;\n@!p griddepcontrol.wait;\nmov.u32 $0, 0;\n}",
                                     "=r,l,l,l,l,l,l,l,l,l",
                                     [a, b, c, d, e, f, g, h, i], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pick(blk, nb1, nb2, a, b, c, PARTS: tl.constexpr):
    """Per element: a, b or c (one per part; pointers or ints) as blk lies below nb1, below nb2, or above."""
    v = tl.where(blk >= nb1, b, a)
    if PARTS == 3:
        v = tl.where(blk >= nb2, c, v)
    return v


@triton.jit(do_not_specialize=["one"])
def _tiled_mma_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, T, N, KI, per, s_xt, s_yt, one,
                      w1_ptr, s1_ptr, gs1_ptr, b1_ptr, w2_ptr, s2_ptr, gs2_ptr, b2_ptr, nb1, nb2,
                      R: tl.constexpr, KS: tl.constexpr, NT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      LOADS: tl.constexpr, EVEN: tl.constexpr, WIDE: tl.constexpr, PARTS: tl.constexpr,
                      GLU: tl.constexpr, USE_GDC: tl.constexpr, TRIGGER: tl.constexpr, EARLY: tl.constexpr):
    """y [T <= 8 NT, N] = x @ W^T, W in the tiled layout, on mma.sync m16n8k16 fed from registers (the decode and
    the fragment order of linear._linear_mma_kernel). A program has R KS warps: warp KS r + k takes row block
    R pid + r and the k-th of KS ranges of `per` iterations (KI = K/256 in all, EVEN: KS divides it; an iteration is
    4 steps of 4 words a row). Each step a lane loads 16 contiguous bytes (its two rows' words), each iteration 8
    bytes of scales; the KS partial sums are added in shared memory at the end. x_ptr int64 [T, K/4], w_ptr int64,
    s_ptr int64 (tiled packed / scales); element e of the [32 R KS] tensors lives in lane e % 32 of warp e // 32
    (see the plain kernel: the runtime `one` keeps addresses from looking contiguous). PARTS 2-3: y's rows are the
    outputs of 2-3 weights of one K stacked (a fused qkv or gate / up), row blocks [0, nb1), [nb1, nb2), [nb2, ..)
    read from w / w1 / w2 with their scales, global scale and bias. GLU (PARTS 2 of one N, R even): blocks alternate
    between the parts (block 2 j + p: part p's block j), so a program holds both parts' rows j and y [T, N / 2] gets
    silu(part 0) * part 1, the MLP's activation in the epilogue instead of a kernel of its own. EARLY (with USE_GDC,
    LOADS > 0): the first iteration's weights and scales are loaded before waiting for the previous kernel (they are
    static: NVFP4Linear's buffers, never written by a kernel that releases this one early); x only after."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pid = tl.program_id(0)
    e = tl.arange(0, 32 * W)
    lane = (e % 32) * one
    blk = tl.minimum(pid * R + e // (32 * KS), N // 16 - 1).to(tl.int64)  # blocks past the end: read, not stored
    i_lo = ((e // 32) % KS) * per
    tok = lane // 4
    acc0 = tl.zeros(e.shape, tl.float32)
    acc1, acc2, acc3, acc4, acc5, acc6, acc7 = acc0, acc0, acc0, acc0, acc0, acc0, acc0
    if EVEN:  # KS divides K/256: every warp runs `per` whole iterations
        n_w = per
        i_at = i_lo
    else:  # the last warps' ranges are short or empty: their pointers stay in range, extra iterations discarded
        n_w = tl.minimum(tl.maximum(KI - i_lo, 0), per)
        i_at = tl.minimum(i_lo, KI - 1)
    if GLU:  # part blk % 2, its block blk // 2
        up = blk % 2 == 1
        pw = tl.where(up, w1_ptr, w_ptr) + (((blk // 2) * KI + i_at) * 128 + lane) * 2
        ps = tl.where(up, s1_ptr, s_ptr) + ((blk // 2) * KI + i_at) * 32 + lane
    elif PARTS == 1:
        pw = w_ptr + ((blk * KI + i_at) * 128 + lane) * 2  # 4 steps x 32 lanes x 2 words an iteration
        ps = s_ptr + (blk * KI + i_at) * 32 + lane
    else:
        lb = blk - _pick(blk, nb1, nb2, 0, nb1, nb2, PARTS)  # the block within its part
        pw = _pick(blk, nb1, nb2, w_ptr, w1_ptr, w2_ptr, PARTS) + ((lb * KI + i_at) * 128 + lane) * 2
        ps = _pick(blk, nb1, nb2, s_ptr, s1_ptr, s2_ptr, PARTS) + (lb * KI + i_at) * 32 + lane
    k0 = 16 * i_at + lane % 4  # the lane's first word: 16 an iteration, 4 a step
    px0 = x_ptr + tl.minimum(tok, T - 1) * s_xt + 4 * k0
    px1 = x_ptr + tl.minimum(tok + 8, T - 1) * s_xt + 4 * k0
    if not EARLY:
        pdl_enter(USE_GDC, TRIGGER == 1)  # nothing read before the previous kernel is done; the next may launch
    if LOADS == 0:  # each step loads its words just before its decode
        for it in range(0, per):
            adv = (it + 1 < n_w).to(tl.int64)  # short ranges: the pointers stop at their last iteration
            sv = _ld_word(ps)
            b0, b1, b2, b3, b4, b5, b6, b7 = acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7
            for u in tl.static_range(4):
                wt, wb = _ld_pair(pw + 64 * u)
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, sv, u, px0, px1, DT, NT, WIDE)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_keep(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, b0, b1, b2, b3, b4, b5, b6, b7, it < n_w, EVEN, NT)
            pw += 256 * adv
            ps += 32 * adv
            px0 += 64 * adv
            px1 += 64 * adv
    else:  # an iteration's words loaded together; LOADS 2: the next iteration's before this one decodes
        sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = _ld_iter(pw, ps)
        if EARLY:  # those loads overlapped the previous kernel's end; x, y and the rest wait for it
            _gdc_wait_after(sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b)
            if TRIGGER == 1:
                tl.extra.cuda.gdc_launch_dependents()
        for it in range(0, per):
            adv = (it + 1 < n_w).to(tl.int64)  # the last iteration reloads its own words (valid addresses)
            if LOADS == 2:
                pw += 256 * adv
                ps += 32 * adv
                nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b = _ld_iter(pw, ps)
            b0, b1, b2, b3, b4, b5, b6, b7 = acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_iter(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b, sv, px0, px1,
                DT, NT, WIDE)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_keep(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, b0, b1, b2, b3, b4, b5, b6, b7, it < n_w, EVEN, NT)
            if LOADS == 2:
                sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b
            else:
                pw += 256 * adv
                ps += 32 * adv
                sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = _ld_iter(pw, ps)
            px0 += 64 * adv
            px1 += 64 * adv
    if USE_GDC and TRIGGER == 2:
        tl.extra.cuda.gdc_launch_dependents()
    g = tl.arange(0, 32)
    t0 = (2 * (g % 4))[None, :]
    if GLU:  # rows of y, of one part
        row = pid * (8 * R) + tl.arange(0, R // 2)[:, None] * 16 + (g // 4)[None, :]
    else:
        row = pid * (16 * R) + tl.arange(0, R)[:, None] * 16 + (g // 4)[None, :]
        if PARTS > 1:  # rows r and r + 8 lie in one part: its global scale, its bias shifted to the part's first row
            rb = row // 16
            gs_ptr = _pick(rb, nb1, nb2, gs_ptr, gs1_ptr, gs2_ptr, PARTS)
            bias_ptr = _pick(rb, nb1, nb2, bias_ptr, b1_ptr - 16 * nb1, b2_ptr - 16 * nb2, PARTS)
    _store_sum(acc0, row, t0, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS, GLU)
    _store_sum(acc1, row, t0 + 1, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS, GLU)
    _store_sum(acc2, row + 8, t0, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS, GLU)
    _store_sum(acc3, row + 8, t0 + 1, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS,
               GLU)
    if NT == 2:
        _store_sum(acc4, row, t0 + 8, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS,
                   GLU)
        _store_sum(acc5, row, t0 + 9, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS,
                   GLU)
        _store_sum(acc6, row + 8, t0 + 8, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS,
                   HAS_BIAS, GLU)
        _store_sum(acc7, row + 8, t0 + 9, T, N, gs_ptr, bias_ptr, gs1_ptr, b1_ptr, y_ptr, s_yt, one, R, KS,
                   HAS_BIAS, GLU)


@dataclass(frozen=True)
class TiledConfig(KernelConfig):
    """KS warps split K (a power of 2 <= 16; ranges of cdiv(K/256, KS) iterations, the last ones short or empty
    where KS does not divide K/256; 0: planned), R row blocks a program (0: planned, see tiled_config), loads: 0 = each
    step's words just before its decode, 1 = an iteration's words together, 2 = the next iteration's words before
    this one decodes (-1: planned); early: the first iteration's weights loaded before waiting for the previous
    kernel (programmatic dependent launch, loads > 0; -1: wherever it applies, 0: never); NSM: the SM count it plans
    for (tests; None: the GPU's)."""
    KS: int = 0
    R: int = 0
    loads: int = -1
    early: int = -1
    NSM: Optional[int] = None


def _pow2(n: float, up: bool) -> int:
    p = 1
    while (p * 2 <= n) or (up and p < n):
        p *= 2
    return p


def tiled_config(T: int, N: int, K: int, device, cfg=None):
    """(KS, R, per, loads). KS ~ 32 warps an SM over the blocks of 16 rows (the nearest power of 2, <= 16 and at
    least 2 iterations a warp; <= 8 and dividing K/256 where one does above 8 tokens); loads 1 for one token and
    for KS <= 4 up to 8 tokens, else 0. R: 4 / KS warps, doubled above 8 tokens where all the programs still fit
    in one wave of 32 warps an SM (the R warps of one K range share x's loads in L1: at 16 tokens each block
    would read 4x its weight bytes of x from L2); at one token 1, or 2 at KS >= 8 with >= 8 iterations a warp. From
    H100 sweeps of KS x loads (notes, linear round 15) and of KS x R (round 23), an H200 one at T 1 (round 24)."""
    c = TiledConfig.of(cfg)
    KI, blocks, sms = K // TILE_K, N // TILE_N, planned_sms(c.NSM, device)
    ks = c.KS
    if not ks:
        want = 32 * sms / blocks
        ks = _pow2(want, False)
        ks = ks * 2 if want >= 1.5 * ks else ks  # nearest power of 2 (on a log scale, about)
        ks = max(1, min(ks, 16 if T <= 8 else 8, _pow2(max(KI // 2, 1), False)))
        if T > 8:
            while KI % ks:
                ks //= 2
    if ks < 1 or ks & (ks - 1) or ks > 16:
        raise ValueError(f"KS (={ks}) must be a power of 2 <= 16")
    loads = c.loads if c.loads >= 0 else 1 if T == 1 or (T <= 8 and ks <= 4) else 0
    if loads not in (0, 1, 2):
        raise ValueError(f"loads (={loads}) must be 0, 1 or 2")
    if c.early not in (-1, 0, 1):
        raise ValueError(f"early (={c.early}) must be -1, 0 or 1")
    r = c.R
    if not r:
        r = max(1, 4 // ks)
        if T == 1:  # H200: +4 points of floor at 28672 x 4096 and 57344 x 8192, +10 at 8192 x 28672 (round 24)
            r = 2 if ks >= 8 and cdiv(KI, ks) >= 8 else 1
        if T > 8 and 2 * r * ks <= 16 and cdiv(blocks, 2 * r) * 2 * r * ks <= 32 * sms:
            r *= 2
    return ks, r, cdiv(KI, ks), loads


def tiled_usable(x: torch.Tensor) -> bool:
    """sm_90+ (mma.sync, mul.rn.bf16x2), 1-16 tokens, 8-byte aligned activation rows with unit stride."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return 0 < x.shape[0] <= MMA_MAX_T and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0


def _wide_acts(x: torch.Tensor) -> bool:
    """16-byte activation loads: rows 16-byte aligned (0.75-0.92x the time at 16 tokens, ~1x at one)."""
    return x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0


def _tiled_options(T: int, N: int, K: int, device, has_bias: bool, wide: bool, cfg=None, parts: int = 1,
                   glu: bool = False):
    """(grid, per, the kernel's constexprs and launch options) of one call shape (tiled_launch and TiledPlan); glu:
    two parts of N / 2 rows each, a program takes an even number of blocks."""
    ks, r, per, loads = tiled_config(T, N, K, device, cfg)
    if glu:
        if r % 2 and TiledConfig.of(cfg).R:
            raise ValueError(f"R (={r}) must be even for the GLU epilogue")
        r = max(r, 2)
    pdl = _pdl(device, N, K)
    early = pdl["USE_GDC"] and loads > 0 and TiledConfig.of(cfg).early != 0  # T1 0.92-1.0x the time (round 23)
    return (cdiv(N // 16, r),), per, dict(R=r, KS=ks, NT=1 if T <= 8 else 2, HAS_BIAS=has_bias, LOADS=loads,
                                          EVEN=(K // TILE_K) % ks == 0, WIDE=wide, PARTS=parts, GLU=glu,
                                          num_warps=r * ks, EARLY=early, **pdl)


EARLY_RELEASE_BYTES = 48 << 20  # weights below: release the next kernel at entry, else after the main loop


def _pdl(device, N: int, K: int) -> dict:
    """Programmatic dependent launch where the GPU has it: launched while the previous kernel finishes, waiting at
    entry; the next kernel released at entry (small weights: its launch and ramp hide under this one's) or after the
    main loop (large: its waiting programs would hold SM slots through a long stream). H100, notes linear round 18:
    an 8B-shaped compiled decode step 2.95 -> 2.59-2.77 ms with inductor's PDL; back-to-back calls 4096 x 4096 at
    one token 43 -> 48 % of the floor released at entry, 28672 x 4096 87 -> 83 % at entry, 88 % after the loop."""
    on = pdl_enabled(device)
    return dict(USE_GDC=on, TRIGGER=1 if N * K // 2 < EARLY_RELEASE_BYTES else 2,
                **({"launch_pdl": True} if on else {}))


def _more_parts(first, rest) -> list:
    """The kernel's parts 2 and 3, (packed, scales, gs, bias) each, flat: rest (0, 4 or 8 tensors), then part 1's
    for each absent part; an absent bias is part 1's stand-in (first[3])."""
    return [t if t is not None else first[3] for t in rest] + list(first) * (2 - len(rest) // 4)


def _starts(Ns) -> tuple:
    """The row blocks where parts 2 and 3 start (unused with one part)."""
    return Ns[0] // 16, (Ns[0] + (Ns[1] if len(Ns) > 1 else 0)) // 16


def tiled_launch(x, packed, scales, gs, bias, y, cfg=None, parts=(), glu=False):
    """x [T, K] (tiled_usable), packed / scales in the tiled layout, gs fp32 [1], bias fp32 [N] or None -> y.
    parts: 1-2 more (packed, scales, gs, bias) of the same K whose outputs y's further columns hold (a fused layer;
    bias present in all or none). glu (one more part of the same N): y [T, N] = silu(first) * the other."""
    T, K = x.shape
    ws = [(_u8(p).view(torch.int64), _u8(sc).view(torch.int64), g, b)
          for p, sc, g, b in [(packed, scales, gs, bias), *parts]]
    Ns = [w[0].shape[0] for w in ws]
    if glu and (len(Ns) != 2 or Ns[0] != Ns[1]):
        raise ValueError(f"glu needs one more part of the same out_features, got parts of {Ns} rows")
    N = sum(Ns)
    grid, per, opts = _tiled_options(T, N, K, x.device, bias is not None, _wide_acts(x), cfg, len(ws), glu)
    first = (*ws[0][:3], bias if bias is not None else gs)
    launch(_tiled_mma_kernel, grid, x.view(torch.int64), *first[:2], gs, first[3], y, T, N, K // TILE_K, per,
           x.stride(0) // 4, y.stride(0), 1, *_more_parts(first, [t for w in ws[1:] for t in w]), *_starts(Ns),
           **opts)
    return y


class TiledPlan:
    """The kernel launch of one call shape (x's shape, strides, dtype; the parts' N, K; bias or not; glu), worked
    out once."""
    __slots__ = ("T", "N", "dtype", "ints", "main", "nb")

    def __init__(self, x, Ns, has_bias, glu=False):
        T, K = x.shape
        N = sum(Ns)
        grid, per, opts = _tiled_options(T, N, K, x.device, has_bias, _wide_acts(x), None, len(Ns), glu)  # in key
        self.T, self.N, self.dtype = T, N // 2 if glu else N, x.dtype
        self.ints = (T, N, K // TILE_K, per, x.stride(0) // 4, self.N, 1)  # y's row stride: its width
        self.nb = _starts(Ns)
        self.main = Launch(_tiled_mma_kernel, grid, **opts)

    def __call__(self, x, packed, scales, gs, bias, *parts):
        """parts: the further parts' packed, scales, gs, bias, flat (as many as the plan was made for)."""
        y = torch.empty(self.T, self.N, dtype=self.dtype, device=x.device)
        b = bias if bias is not None else gs
        more = _more_parts((packed, scales, gs, b), parts)
        if not self.main.direct():  # the kept launcher reads addresses only; Triton's path types the pointers
            x, packed, scales = x.view(torch.int64), _u8(packed).view(torch.int64), _u8(scales).view(torch.int64)
            more = [_u8(t).view(torch.int64) if i % 4 < 2 else t for i, t in enumerate(more)]
        self.main(x, packed, scales, gs, b, y, *self.ints, *more, *self.nb)
        return y
