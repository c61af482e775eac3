"""NVFP4 linear on a tiled weight layout (what NVFP4Linear stores where out_features % 16 == 0 and in_features %
256 == 0): each mma-kernel warp's weight words and scales lie contiguous in memory, 512 bytes a step, so a load
instruction reads four whole 128-byte lines (the plain layout gives 8 rows x 32 bytes) and a warp streams one
contiguous range. Measured on the H100: 1.12-1.6x the plain-layout kernel (notes/nvfp4_gemv.md, linear round 13).

Layout, for 16-row block b and 8-byte weight word w (16 E2M1 codes: one scale block) of row r = 16 b + g + 8 h:
packed (uint8 [N, K/2], the same bytes reordered) holds word [b, w // 4, 4 g + w % 4, h] of an int64
[N/16, K/64, 32, 2] array (the 32 = the mma lanes: lane 4 g + c takes words c, c + 4, ... of rows g and g + 8);
scales (e4m3 [N, K/16]) hold byte [b, w // 16, 4 g + w % 4, 2 ((w // 4) % 4) + h] of [N/16, K/256, 32, 8] (a lane's
scales for 4 steps in one 8-byte word)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._launch import Launch, launch
from ..._runtime import capability, cdiv, interpreting, num_sms
from .common import e4m3_f32
from .linear import MMA_MAX_T, _mma_acts, _mma_issue, _mma_start, _store_out

TILE_N, TILE_K = 16, 256


def tileable(N: int, K: int) -> bool:
    return N > 0 and K > 0 and N % TILE_N == 0 and K % TILE_K == 0


def _u8(t):
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def tile_packed(packed: torch.Tensor) -> torch.Tensor:
    """Plain [N, K/2] packed codes (uint8 or float4_e2m1fn_x2) -> the tiled layout, same shape and dtype."""
    N, KH = packed.shape
    w = _u8(packed).contiguous().view(torch.int64).view(N // 16, 2, 8, KH // 32, 4)  # b, h, g, j, c
    return w.permute(0, 3, 2, 4, 1).contiguous().view(torch.uint8).view(N, KH).view(packed.dtype)


def untile_packed(packed: torch.Tensor) -> torch.Tensor:
    N, KH = packed.shape
    w = _u8(packed).contiguous().view(torch.int64).view(N // 16, KH // 32, 8, 4, 2)  # b, j, g, c, h
    return w.permute(0, 4, 2, 1, 3).contiguous().view(torch.uint8).view(N, KH).view(packed.dtype)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """Plain [N, K/16] e4m3 scales -> the tiled layout, same shape and dtype."""
    N, KS = scales.shape
    s = _u8(scales).contiguous().view(N // 16, 2, 8, KS // 16, 4, 4)  # b, h, g, i, u, c
    return s.permute(0, 3, 2, 5, 4, 1).contiguous().view(N, KS).view(scales.dtype)


def untile_scales(scales: torch.Tensor) -> torch.Tensor:
    N, KS = scales.shape
    s = _u8(scales).contiguous().view(N // 16, KS // 16, 8, 4, 4, 2)  # b, i, g, c, u, h
    return s.permute(0, 5, 2, 1, 4, 3).contiguous().view(N, KS).view(scales.dtype)


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
def _store_sum(acc, row, t, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R: tl.constexpr, KS: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    """The sum of one accumulator over the KS warps that split K ([32 R KS] -> [R, 32], in shared memory), stored by
    the plain kernel's _store_out (scale, bias, masks)."""
    if KS == 1:
        v = tl.reshape(acc, [R, 32])
    else:
        v = tl.sum(tl.reshape(acc, [R, KS, 32]), axis=1)
    _store_out(v, row, t, 0, T, N, gs_ptr, bias_ptr, y_ptr, y_ptr, s_yt, one, False, HAS_BIAS)


@triton.jit
def _tiled_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, sv, u: tl.constexpr, px0, px1, la, lb, ha, hb,
                DT: tl.constexpr, NT: tl.constexpr):
    """Step u of an iteration: words wt / wb, their scales in bytes 2u / 2u + 1 of sv, the activations at px + 16u."""
    st = e4m3_f32(((sv >> (16 * u)) & 0xFF).to(tl.uint8), False).to(DT)
    sb = e4m3_f32(((sv >> (16 * u + 8)) & 0xFF).to(tl.uint8), False).to(DT)
    x0, x1, x2, x3 = _mma_acts(px0 + 16 * u, True, 1)
    x4, x5, x6, x7 = x0, x1, x2, x3
    if NT == 2:
        x4, x5, x6, x7 = _mma_acts(px1 + 16 * u, True, 1)
    return _mma_issue(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, st, sb, x0, x1, x2, x3, x4, x5, x6, x7,
                      la, lb, ha, hb, DT, NT)


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


@triton.jit(do_not_specialize=["one"])
def _tiled_mma_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, T, N, KI, per, s_xt, s_yt, one,
                      R: tl.constexpr, KS: tl.constexpr, NT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      LOADS: tl.constexpr, EVEN: tl.constexpr):
    """y [T <= 8 NT, N] = x @ W^T, W in the tiled layout, on mma.sync m16n8k16 fed from registers (the decode and
    the fragment order of linear._linear_mma_kernel). A program has R KS warps: warp KS r + k takes row block
    R pid + r and the k-th of KS ranges of `per` iterations (KI = K/256 in all, EVEN: KS divides it; an iteration is
    4 steps of 4 words a row). Each step a lane loads 16 contiguous bytes (its two rows' words), each iteration 8
    bytes of scales; the KS partial sums are added in shared memory at the end. x_ptr int64 [T, K/4], w_ptr int64,
    s_ptr int64 (tiled packed / scales); element e of the [32 R KS] tensors lives in lane e % 32 of warp e // 32
    (see the plain kernel: the runtime `one` keeps addresses from looking contiguous)."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pid = tl.program_id(0)
    e = tl.arange(0, 32 * W)
    lane = (e % 32) * one
    blk = tl.minimum(pid * R + e // (32 * KS), N // 16 - 1).to(tl.int64)  # blocks past the end: read, not stored
    i_lo = ((e // 32) % KS) * per
    tok = lane // 4
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, la, lb, ha, hb = _mma_start(e, DT)
    if EVEN:  # KS divides K/256: every warp runs `per` whole iterations
        n_w = per
        i_at = i_lo
    else:  # the last warps' ranges are short or empty: their pointers stay in range, extra iterations discarded
        n_w = tl.minimum(tl.maximum(KI - i_lo, 0), per)
        i_at = tl.minimum(i_lo, KI - 1)
    pw = w_ptr + ((blk * KI + i_at) * 128 + lane) * 2  # 4 steps x 32 lanes x 2 words an iteration
    ps = s_ptr + (blk * KI + i_at) * 32 + lane
    k0 = 16 * i_at + lane % 4  # the lane's first word: 16 an iteration, 4 a step
    px0 = x_ptr + tl.minimum(tok, T - 1) * s_xt + 4 * k0
    px1 = x_ptr + tl.minimum(tok + 8, T - 1) * s_xt + 4 * k0
    if LOADS == 0:  # each step loads its words just before its decode
        for it in range(0, per):
            adv = (it + 1 < n_w).to(tl.int64)  # short ranges: the pointers stop at their last iteration
            sv = _ld_word(ps)
            b0, b1, b2, b3, b4, b5, b6, b7 = acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7
            for u in tl.static_range(4):
                wt, wb = _ld_pair(pw + 64 * u)
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, wt, wb, sv, u, px0, px1, la, lb, ha, hb, DT, NT)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_keep(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, b0, b1, b2, b3, b4, b5, b6, b7, it < n_w, EVEN, NT)
            pw += 256 * adv
            ps += 32 * adv
            px0 += 64 * adv
            px1 += 64 * adv
    else:  # an iteration's words loaded together; LOADS 2: the next iteration's before this one decodes
        sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = _ld_iter(pw, ps)
        for it in range(0, per):
            adv = (it + 1 < n_w).to(tl.int64)  # the last iteration reloads its own words (valid addresses)
            if LOADS == 2:
                pw += 256 * adv
                ps += 32 * adv
                nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b = _ld_iter(pw, ps)
            b0, b1, b2, b3, b4, b5, b6, b7 = acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w0t, w0b, sv, 0, px0, px1, la, lb, ha, hb, DT, NT)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w1t, w1b, sv, 1, px0, px1, la, lb, ha, hb, DT, NT)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w2t, w2b, sv, 2, px0, px1, la, lb, ha, hb, DT, NT)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w3t, w3b, sv, 3, px0, px1, la, lb, ha, hb, DT, NT)
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
    g = tl.arange(0, 32)
    row = pid * (16 * R) + tl.arange(0, R)[:, None] * 16 + (g // 4)[None, :]
    t0 = (2 * (g % 4))[None, :]
    _store_sum(acc0, row, t0, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
    _store_sum(acc1, row, t0 + 1, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
    _store_sum(acc2, row + 8, t0, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
    _store_sum(acc3, row + 8, t0 + 1, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
    if NT == 2:
        _store_sum(acc4, row, t0 + 8, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
        _store_sum(acc5, row, t0 + 9, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
        _store_sum(acc6, row + 8, t0 + 8, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)
        _store_sum(acc7, row + 8, t0 + 9, T, N, gs_ptr, bias_ptr, y_ptr, s_yt, one, R, KS, HAS_BIAS)


@dataclass(frozen=True)
class TiledConfig(KernelConfig):
    """KS warps split K (a power of 2 <= 16; ranges of cdiv(K/256, KS) iterations, the last ones short or empty
    where KS does not divide K/256; 0: planned), R row blocks a program (0: KS >= 4 ? 1 : 4 / KS), loads: 0 = each
    step's words just before its decode, 1 = an iteration's words together, 2 = the next iteration's words before
    this one decodes (-1: planned)."""
    KS: int = 0
    R: int = 0
    loads: int = -1


def _pow2(n: float, up: bool) -> int:
    p = 1
    while (p * 2 <= n) or (up and p < n):
        p *= 2
    return p


def tiled_config(T: int, N: int, K: int, device, cfg=None):
    """(KS, R, per, loads). Up to 8 tokens: the next iteration's weights in flight (loads 2), KS = 16384 / blocks of
    16 rows (rounded down, <= 8); 9-16 tokens: each step's words just before its decode (loads 0; the grouped loads
    lost 4-8 points there), KS ~32 warps an SM (rounded down, <= 8), a power of 2 dividing K/256 where one does
    (no idle iterations). Both from A/B runs of KS / 2, KS, 2 KS on the H100 (notes, linear round 13)."""
    c = TiledConfig.of(cfg)
    KI, blocks = K // TILE_K, N // TILE_N
    ks = c.KS
    if not ks:
        ks = min(8, _pow2(16384 / blocks, False)) if T <= 8 else min(8, _pow2(32 * num_sms(device) / blocks, False))
        if T > 8:
            while KI % ks:
                ks //= 2
    if ks < 1 or ks & (ks - 1) or ks > 16:
        raise ValueError(f"KS (={ks}) must be a power of 2 <= 16")
    loads = c.loads if c.loads >= 0 else 2 if T <= 8 else 0
    if loads not in (0, 1, 2):
        raise ValueError(f"loads (={loads}) must be 0, 1 or 2")
    return ks, c.R or max(1, 4 // ks), cdiv(KI, ks), loads


def tiled_usable(x: torch.Tensor) -> bool:
    """sm_90+ (mma.sync, mul.rn.bf16x2), 1-16 tokens, 8-byte aligned activation rows with unit stride."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return 0 < x.shape[0] <= MMA_MAX_T and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0


def _tiled_options(T: int, N: int, K: int, device, has_bias: bool, cfg=None):
    """(grid, per, the kernel's constexprs and launch options) of one call shape (tiled_launch and TiledPlan)."""
    ks, r, per, loads = tiled_config(T, N, K, device, cfg)
    return (cdiv(N // 16, r),), per, dict(R=r, KS=ks, NT=1 if T <= 8 else 2, HAS_BIAS=has_bias, LOADS=loads,
                                          EVEN=(K // TILE_K) % ks == 0, num_warps=r * ks)


def tiled_launch(x, packed, scales, gs, bias, y, cfg=None):
    """x [T, K] (tiled_usable), packed / scales in the tiled layout, gs fp32 [1], bias fp32 [N] or None -> y."""
    T, K = x.shape
    N = packed.shape[0]
    grid, per, opts = _tiled_options(T, N, K, x.device, bias is not None, cfg)
    launch(_tiled_mma_kernel, grid, x.view(torch.int64), _u8(packed).view(torch.int64),
           _u8(scales).view(torch.int64), gs, bias if bias is not None else gs, y, T, N, K // TILE_K, per,
           x.stride(0) // 4, y.stride(0), 1, **opts)
    return y


class TiledPlan:
    """The kernel launch of one call shape (x's shape, strides, dtype; N, K; bias or not), worked out once."""
    __slots__ = ("T", "N", "dtype", "ints", "main")

    def __init__(self, x, N, has_bias):
        T, K = x.shape
        grid, per, opts = _tiled_options(T, N, K, x.device, has_bias)
        self.T, self.N, self.dtype = T, N, x.dtype
        self.ints = (T, N, K // TILE_K, per, x.stride(0) // 4, N, 1)
        self.main = Launch(_tiled_mma_kernel, grid, **opts)

    def __call__(self, x, packed, scales, gs, bias):
        y = torch.empty(self.T, self.N, dtype=self.dtype, device=x.device)
        if not self.main.direct():  # the kept launcher reads addresses only; Triton's path types the pointers
            x, packed, scales = x.view(torch.int64), _u8(packed).view(torch.int64), _u8(scales).view(torch.int64)
        self.main(x, packed, scales, gs, bias if bias is not None else gs, y, *self.ints)
        return y
