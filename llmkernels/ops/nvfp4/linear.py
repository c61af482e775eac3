"""NVFP4 weight-only linear for Hopper (y = x W^T, bf16 / fp16 activations, NVFP4 weights decoded in registers):
a dot kernel (tl.dot on decoded tiles), a register-fed mma.sync kernel for up to 16 tokens (weights decoded straight
into mma fragments), and the dequantize kernel for larger batches (dequantize + matmul)."""
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._launch import Launch, launch
from ..._runtime import capability, cdiv, interpreting, next_pow2, num_sms
from .common import (ASM_MMA2_BF16, ASM_MMA2_F16, ASM_MMA_BF16, ASM_MMA_F16, ASM_TABLES_BF16, ASM_TABLES_F16,
                     ASM_W16_BF16, ASM_W16_F16, _nvfp4_splitk_reduce_kernel, e2m1_f16, e4m3_f32)


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
            sc = tl.reshape(tl.broadcast_to(e4m3_f32(sc, False).to(xe.dtype)[:, :, None], [BN, BKH // 8, 8]),
                            [BN, BKH])
            lo, hi = tl.inline_asm_elementwise(
                ASM_W16_BF16 if xe.dtype == tl.bfloat16 else ASM_W16_F16, "=r,=r,=r,=r,r,r,r", [w, sc],
                dtype=(xe.dtype, xe.dtype), is_pure=True, pack=4)
        else:
            sc = e4m3_f32(sc, FIX_NAN) * 16384.0  # undoes the 2^-14 of e2m1_f16
            sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BN, BKH // 8, 8]), [BN, BKH])
            lo = (e2m1_f16(w & 15).to(tl.float32) * sc).to(xe.dtype)
            hi = (e2m1_f16(w >> 4).to(tl.float32) * sc).to(xe.dtype)
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
def _mma_tables(e, DT: tl.constexpr):
    """The decode's 4 byte tables, once per program, in vector registers (see common._asm_tables)."""
    return tl.inline_asm_elementwise(ASM_TABLES_BF16 if DT == tl.bfloat16 else ASM_TABLES_F16, "=r,=r,=r,=r,r", [e],
                                     dtype=(tl.int32,) * 4, is_pure=True, pack=1)


@triton.jit
def _mma_start(e, DT: tl.constexpr):
    """The 8 zeroed fp32 accumulators of an mma kernel (shaped like e) and the decode's byte tables."""
    z = tl.zeros(e.shape, tl.float32)
    la, lb, ha, hb = _mma_tables(e, DT)
    return z, z, z, z, z, z, z, z, la, lb, ha, hb


@triton.jit
def _mma_issue(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7,
               la, lb, ha, hb, DT: tl.constexpr, NT: tl.constexpr):
    """One mma step: weight words wt / wb (rows r, r + 8: one scale block each) with their scales st / sb (in DT),
    times the activation words x0..x3 (token group 0) and x4..x7 (group 1, NT == 2); la..hb: _mma_tables."""
    if NT == 2:
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = tl.inline_asm_elementwise(
            ASM_MMA2_BF16 if DT == tl.bfloat16 else ASM_MMA2_F16,
            "=f,=f,=f,=f,=f,=f,=f,=f,0,1,2,3,4,5,6,7,l,l,h,h,l,l,l,l,l,l,l,l,r,r,r,r",
            [acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7,
             la, lb, ha, hb], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
            ASM_MMA_BF16 if DT == tl.bfloat16 else ASM_MMA_F16, "=f,=f,=f,=f,0,1,2,3,l,l,h,h,l,l,l,l,r,r,r,r",
            [acc0, acc1, acc2, acc3, wt, wb, st, sb, x0, x1, x2, x3, la, lb, ha, hb],
            dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _mma_acts(xb, xm, one):
    """The 4 activation words (16 values) at xb (a token's columns of one weight word); xm: their mask, or True."""
    return (tl.load(xb, mask=xm, other=0), tl.load(xb + one, mask=xm, other=0),
            tl.load(xb + 2 * one, mask=xm, other=0), tl.load(xb + 3 * one, mask=xm, other=0))


@triton.jit
def _mma_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w_ptr, s_ptr, x_ptr, r_top, r_bot, tok, kw, k_hi,
              N, T, s_wn, s_sn, s_xt, one, la, lb, ha, hb, DT: tl.constexpr, NT: tl.constexpr):
    """One masked mma step at weight word kw (< k_hi) of rows r_top / r_bot (< N), tokens tok (+ 8) (< T): the
    K tail. Masked-off words read as 0 (weights and activations), so they add nothing."""
    k_ok = kw < k_hi
    m_t = (r_top < N) & k_ok
    m_b = (r_bot < N) & k_ok
    wt = tl.load(w_ptr + r_top.to(tl.int64) * s_wn + kw, mask=m_t, other=0)
    wb = tl.load(w_ptr + r_bot.to(tl.int64) * s_wn + kw, mask=m_b, other=0)
    st = e4m3_f32(tl.load(s_ptr + r_top.to(tl.int64) * s_sn + kw, mask=m_t, other=0), False).to(DT)
    sb = e4m3_f32(tl.load(s_ptr + r_bot.to(tl.int64) * s_sn + kw, mask=m_b, other=0), False).to(DT)
    x0, x1, x2, x3 = _mma_acts(x_ptr + tok * s_xt + 4 * kw, (tok < T) & k_ok, one)
    x4, x5, x6, x7 = x0, x1, x2, x3
    if NT == 2:
        x4, x5, x6, x7 = _mma_acts(x_ptr + (tok + 8) * s_xt + 4 * kw, (tok + 8 < T) & k_ok, one)
    return _mma_issue(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6,
                      x7, la, lb, ha, hb, DT, NT)


@triton.jit
def _load_w(p, L2_128: tl.constexpr):
    """A weight word. L2_128: with the L2 128-byte prefetch qualifier, so a row's first 32-byte sector brings the
    line's other three (+12-17 points of the floor where a program streams >= 96 words of each row, within -1 to
    -2.4 for shorter runs: notes/nvfp4_gemv.md, linear round 12)."""
    if L2_128:
        return tl.inline_asm_elementwise("ld.global.nc.L2::128B.b64 $0, [$1];", "=l,l",
                                         [p.to(tl.int64, bitcast=True)], dtype=tl.int64, is_pure=True, pack=1)
    else:
        return tl.load(p)


@triton.jit(do_not_specialize=["one"])
def _linear_mma_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr,
                       T, N, KW, per_split, s_xt, s_wn, s_sn, s_yt, one,
                       W: tl.constexpr, U: tl.constexpr, NT: tl.constexpr, PARTIAL: tl.constexpr,
                       HAS_BIAS: tl.constexpr, L2_128: tl.constexpr):
    """y [T <= 8 NT, N] = x @ W^T on mma.sync m16n8k16 fed from registers: warp g of the program owns rows
    16g..16g+15 (of BM = 16 W), tokens are the mma's N (NT groups of 8, the weights decoded once for all). x_ptr
    int64 [T, K/4] (4 activations a word), w_ptr int64 [N, K/16] (one scale block a word), s_ptr uint8 [N, K/16];
    KW = K/16 words per row. An iteration covers 4 U words of K: thread c (of the 4 in a row's group) takes words
    c, c + 4, .., c + 4 (U - 1), so a group's loads of one step are contiguous (coalesced; U contiguous words a
    thread read 4x the sectors an instruction and lost up to 2x at T = 16), and addresses are kept pointers plus
    constants.

    Element e of the [32 W] tensors below must live in lane e % 32 of warp e // 32 (so lane = 4 * group + thread
    in group, the mma fragment order): Triton's default layout for a 1-D tensor of 32 W elements over W warps, as
    long as no address looks contiguous (which would give a thread several elements): the runtime `one` (= 1, not
    specialised) sees to that. The GPU tests check the result."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    pid = tl.program_id(0)
    split = tl.program_id(1)
    e = tl.arange(0, 32 * W)
    lane = e % 32
    c = (lane % 4) * one  # thread in group: words c + 4 u of each iteration of 4 U
    r_top = pid * (16 * W) + (e // 32) * 16 + lane // 4
    r_bot = r_top + 8
    tok = lane // 4  # the mma's column n: a token (of each group of 8)
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, KW)
    # per group of 8 tokens: (row r, token 2c), (r, 2c + 1), (r + 8, 2c), (r + 8, 2c + 1)
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, la, lb, ha, hb = _mma_start(e, DT)
    # whole iterations without masks: rows and tokens past the end are clamped (read, never stored)
    k_full = k_lo + (k_hi - k_lo) // (4 * U) * (4 * U)
    k0 = k_lo + c
    rt = tl.minimum(r_top, N - 1).to(tl.int64)
    rb = tl.minimum(r_bot, N - 1).to(tl.int64)
    pwt = w_ptr + rt * s_wn + k0
    pwb = w_ptr + rb * s_wn + k0
    pst = s_ptr + rt * s_sn + k0
    psb = s_ptr + rb * s_sn + k0
    px0 = x_ptr + tl.minimum(tok, T - 1) * s_xt + 4 * k0
    px1 = x_ptr + tl.minimum(tok + 8, T - 1) * s_xt + 4 * k0
    for _ in range(k_lo, k_full, 4 * U):
        for u in tl.static_range(U):
            wt = _load_w(pwt + 4 * u, L2_128)
            wb = _load_w(pwb + 4 * u, L2_128)
            st = e4m3_f32(tl.load(pst + 4 * u), False).to(DT)
            sb = e4m3_f32(tl.load(psb + 4 * u), False).to(DT)
            x0, x1, x2, x3 = _mma_acts(px0 + 16 * u, True, 1)
            x4, x5, x6, x7 = x0, x1, x2, x3
            if NT == 2:
                x4, x5, x6, x7 = _mma_acts(px1 + 16 * u, True, 1)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _mma_issue(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7,
                la, lb, ha, hb, DT, NT)
        pwt += 4 * U
        pwb += 4 * U
        pst += 4 * U
        psb += 4 * U
        px0 += 16 * U
        px1 += 16 * U
    for kt in range(k_full, k_hi, 4 * U):  # the tail (fewer than 4 U words), masked
        for u in tl.static_range(U):
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _mma_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w_ptr, s_ptr, x_ptr, r_top, r_bot, tok,
                kt + 4 * u + c, k_hi, N, T, s_wn, s_sn, s_xt, one, la, lb, ha, hb, DT, NT)
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
    sk = k0 // 8 + tl.arange(0, BKH // 8)
    ms = (rows < N)[:, None] & (sk * 8 < KH)[None, :]
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * s_wn + kb[None, :], mask=m2, other=0)
    sc = tl.load(s_ptr + rows[:, None].to(tl.int64) * s_sn + sk[None, :], mask=ms, other=0)
    sc = e4m3_f32(sc, FIX_NAN) * (16384.0 * tl.load(gs_ptr))
    sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BN, BKH // 8, 8]), [BN, BKH])
    lo = e2m1_f16(w & 15).to(tl.float32) * sc
    hi = e2m1_f16(w >> 4).to(tl.float32) * sc
    v = tl.reshape(tl.join(lo, hi), [BN, 2 * BKH])  # interleave: value 2kb then 2kb + 1
    cols = 2 * k0 + tl.arange(0, 2 * BKH)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * s_on + cols[None, :], v.to(out_ptr.dtype.element_ty),
             mask=(rows < N)[:, None] & (cols < 2 * KH)[None, :])


# ---- host side -------------------------------------------------------------------------------------

MAX_FUSED_T = 16  # tokens handled by the fused kernel (weights read once); above that: dequantize + matmul


@dataclass(frozen=True)
class DotConfig(KernelConfig):
    """The dot kernel: BN weight rows and BKH packed K bytes a tile, warps, split over K, pipeline depth."""
    BN: int = 64
    BKH: int = 128
    num_warps: int = 4
    split: int = 1
    num_stages: int = 2


@dataclass(frozen=True)
class MmaConfig(KernelConfig):
    """The mma kernel: W warps of 16 rows a program, U k-steps of 64 bytes unrolled, programs per SM the split over
    K aims at."""
    W: int = 4
    U: int = 4
    programs_per_sm: int = 8


def linear_plan(T: int, N: int, KH: int, device: torch.device) -> DotConfig:
    """Measured on H100: 128-row tiles with 8 warps for <= 4 tokens, 64-row tiles with 4 warps above."""
    BN, BKH, nw = (128, 64, 8) if T <= 4 else (64, 128, 4)
    tiles = cdiv(N, BN)
    target = 2 * num_sms(device)
    split = 1 if tiles >= target else min(-(-target // tiles), cdiv(KH, BKH))
    return DotConfig(BN=BN, BKH=BKH, num_warps=nw, split=split, num_stages=2)


_linear_plan = functools.lru_cache(maxsize=1024)(linear_plan)  # per call shape, read-only (the host path)


def _unit_k(t: torch.Tensor) -> torch.Tensor:
    """The [rows, K-bytes] weight or scale matrix with unit stride along K (copied once if not)."""
    return t if t.stride(1) == 1 else t.contiguous()


def _reduce_linear(part, y, gs, bias):
    """y [T, N] = global scale * sum over splits of part [S, T, N] (+ bias), in a fixed order."""
    S, T, N = part.shape
    blk = 256
    launch(_nvfp4_splitk_reduce_kernel, (cdiv(N, blk), T), part, y, gs, bias if bias is not None else gs, 1.0,
           T, N, y.stride(0), 1, SPLIT=S, BLOCK=blk, HAS_SCALE_PTR=True, HAS_BIAS=bias is not None)


def reduce_plan(split: int, T: int, N: int, has_bias: bool):
    """_reduce_linear for a plan (None without a split): called as (part, y, gs, bias or gs, 1.0, T, N, y.stride(0),
    1) on y [T, N] with unit column stride."""
    return Launch(_nvfp4_splitk_reduce_kernel, (cdiv(N, 256), T), SPLIT=split, BLOCK=256, HAS_SCALE_PTR=True,
                  HAS_BIAS=has_bias) if split > 1 else None


MMA_MAX_T = 16  # tokens of the register-fed mma kernel: one or two groups of 8 (the mma's N)


def _mma_usable(x, w8, y) -> bool:
    """sm_90+ (mma.sync, mul.rn.bf16x2), at most 16 tokens, 8-byte aligned rows of weights and activations."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return (x.shape[0] <= MMA_MAX_T and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0
            and w8.stride(0) % 8 == 0 and w8.data_ptr() % 8 == 0 and y.stride(1) == 1)


L2_128_WORDS = 96  # weight words of a row a program streams from which the L2 128-byte loads pay (round 12)


def _mma_options(c: MmaConfig, T: int, split: int, per: int, has_bias: bool) -> dict:
    """The mma kernel's constexprs and launch options for one call shape (linear_mma_launch and MmaPlan)."""
    return dict(W=c.W, U=c.U, NT=1 if T <= 8 else 2, PARTIAL=split > 1, HAS_BIAS=has_bias,
                L2_128=per >= L2_128_WORDS, num_warps=c.W)


def _mma_config(T, N, KW, device, cfg=None):
    """(c, tiles, split, per): W warps of 16 rows, U k-steps, and the split over K that fills the GPU."""
    c = MmaConfig.of(cfg)
    tiles = cdiv(N, 16 * c.W)
    step = 4 * c.U
    target = c.programs_per_sm * num_sms(device)
    split = 1 if tiles >= target else min(-(-target // tiles), cdiv(KW, step))
    per = -(-(-(-KW // split)) // step) * step
    return c, tiles, max(1, -(-KW // per)), per


def linear_mma_launch(x, w8, s8, gs, bias, y, cfg=None):
    """T <= 16: the mma-fragment kernel. x [T, K], w8 uint8 [N, K/2] (8-byte aligned rows), s8 uint8 [N, K/16]."""
    T, K = x.shape
    N, KH = w8.shape
    KW = KH // 8
    c, tiles, split, per = _mma_config(T, N, KW, x.device, cfg)
    part = torch.empty(split, T, N, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_linear_mma_kernel, (tiles, split),
        x.view(torch.int64), w8.view(torch.int64), s8, gs, bias if bias is not None else gs, y, part,
        T, N, KW, per, x.stride(0) // 4, w8.stride(0) // 8, s8.stride(0), y.stride(0), 1,
        **_mma_options(c, T, split, per, bias is not None))
    if split > 1:
        _reduce_linear(part, y, gs, bias)
    return y


class MmaPlan:
    """The launches of one mma-kernel call shape, for the op's cached plans (see _launch): the key fixes T, N, K,
    dtypes, strides and alignment, so the configuration, grids and kernels are worked out once; a call allocates
    y (and the split parts) and hands its pointers to the compiled kernels."""
    __slots__ = ("T", "N", "KW", "per", "split", "dtype", "bias", "strides", "main", "reduce")

    def __init__(self, x, w8, s8, bias):
        T, N, KW = x.shape[0], w8.shape[0], w8.shape[1] // 8
        c, tiles, self.split, self.per = _mma_config(T, N, KW, x.device)
        self.T, self.N, self.KW, self.dtype, self.bias = T, N, KW, x.dtype, bias is not None
        self.strides = (x.stride(0) // 4, w8.stride(0) // 8, s8.stride(0), N, 1)
        self.main = Launch(_linear_mma_kernel, (tiles, self.split),
                           **_mma_options(c, T, self.split, self.per, self.bias))
        self.reduce = reduce_plan(self.split, T, N, self.bias)

    @staticmethod
    def usable(x, w8, s8, bias) -> bool:
        return 0 < x.shape[0] and w8.shape[0] > 0 and w8.stride(1) == 1 and s8.stride(1) == 1 and \
            (bias is None or bias.stride(0) == 1) and _mma_usable(x, w8, x)

    def __call__(self, x, w8, s8, gs, bias):
        """x [T, K], w8 [N, K/2] and s8 [N, K/16] as the plan's key had them, in any dtype of their element size
        (a kept kernel reads addresses only: x stands for its int64 view, a float4 / fp8 weight for its uint8 one)."""
        T, N = self.T, self.N
        y = torch.empty(T, N, dtype=self.dtype, device=x.device)
        b = bias if bias is not None else gs
        if not self.main.direct():  # Triton's path (first call, launch hooks) types the pointers from the tensors
            x, w8, s8 = x.view(torch.int64), w8.view(torch.int64), s8.view(torch.uint8)
        if self.reduce is None:
            self.main(x, w8, s8, gs, b, y, y, T, N, self.KW, self.per, *self.strides)
            return y
        part = torch.empty(self.split, T, N, dtype=torch.float32, device=x.device)
        self.main(x, w8, s8, gs, b, y, part, T, N, self.KW, self.per, *self.strides)
        self.reduce(part, y, gs, b, 1.0, T, N, N, 1)
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
    cfg = DotConfig.of({k: v for k, v in cfg.items() if k != "kernel"}) if cfg and "BN" in cfg else \
        _linear_plan(T, N, KH, x.device)
    BN, BKH = cfg.BN, cfg.BKH
    per = -(-(-(-KH // cfg.split)) // BKH) * BKH
    split = max(1, -(-KH // per))
    part = torch.empty(split, T, N, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_linear_kernel, (cdiv(N, BN), split),
        x, w8, s8, gs, bias if bias is not None else gs, y, part,
        T, N, KH, per, x.stride(0), w8.stride(0), s8.stride(0), y.stride(0),
        BN=BN, BKH=BKH, TP=max(16, next_pow2(T)), PARTIAL=split > 1, HAS_BIAS=bias is not None,
        FIX_NAN=interpreting(), USE_ASM=_asm_decode_usable(x) if use_asm is None else use_asm,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        _reduce_linear(part, y, gs, bias)
    return y


def dequant_launch(w8, s8, gs, out):
    """w8 uint8 [N, K/2], s8 uint8 [N, K/16], gs fp32 [1] -> out [N, K] (e2m1 * scale * gs, rounded once). The
    tiled layout's twin: tiled_layout.dequant_tiled_launch."""
    N, KH = w8.shape
    if N == 0 or KH == 0:
        return out
    w8, s8 = _unit_k(w8), _unit_k(s8)
    BN, BKH = 32, 128
    launch(_dequant_kernel, (cdiv(N, BN), cdiv(KH, BKH)),
        w8, s8, gs, out, N, KH, w8.stride(0), s8.stride(0), out.stride(0), BN=BN, BKH=BKH,
        FIX_NAN=interpreting(), num_warps=4)
    return out
