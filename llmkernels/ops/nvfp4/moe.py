"""nvfp4_moe: a mixture-of-experts layer's routed experts, NVFP4 weights in the tiled layout stacked per projection
([E, N, K/2] bytes, [E, N, K/16] scales, [E] global scales), for decode-sized batches: two launches for all chosen
experts, routing read on the device (no host sync: CUDA-graph capturable).

  h[t, j] = act(gate_e(x_t)) * up_e(x_t)            (e = top_k_index[t, j]; gate / up rounded to x's dtype first)
  y[t]    = sum_j top_k_weights[t, j] * down_e(h[t, j])

Each program decodes the tiled words of its rows (tiled_layout's pair recipe in plain Triton, so the interpreter runs
it too) and reduces them against one token's activations. An index outside [0, E) contributes nothing (transformers'
dropped-slot convention)."""
import os
from typing import Tuple

import torch
import triton
import triton.language as tl

from ..._launch import current_device, keep_plan, kept_plan, launch, tkey, tracing
from ..._runtime import cdiv, interpreting
from ..._validate import check_same_device, check_tensor
from .moe_grouped import moe_grouped
from .moe_tiled import moe_tiled, moe_tiled_pairs, moe_tiled_usable
from .tiled_layout import tiled_values

# Tokens of a call the per-pair kernels take (one program group a (token, slot) pair) before the grouped ones (the
# pairs sorted by expert): on sm_90 the mma pair, then tiles of 8 or 16 pairs of an expert as the mma's token
# columns (moe_tiled_pairs); elsewhere the plain pair, then moe_grouped. H200 records (benchmarks/notes/
# nvfp4_moe.md), 30B / 235B layers, us: T 16 pair 87 / 341 vs tiles 123 / 278; T 32 172 / 630 vs 165 / 371; T 256
# 700 / 2386 vs 289 / 865.
MOE_MAX_T = 16


@triton.jit
def _rows_dot(w_ptr, s_ptr, x_ptr, r, N, KW, BN: tl.constexpr, BKW: tl.constexpr, FIX_NAN: tl.constexpr):
    """[BN] fp32: rows r [BN] of one tiled weight (without its global scale) . x [16 KW]."""
    acc = tl.zeros([BN], tl.float32)
    for kw0 in range(0, KW, BKW):
        kw = kw0 + tl.arange(0, BKW)[None, :]
        v = tiled_values(w_ptr, s_ptr, r[:, None], kw, N, KW, 1.0, BN, BKW, FIX_NAN)
        k = kw0 * 16 + tl.arange(0, 16 * BKW)
        xk = tl.load(x_ptr + k, mask=k < 16 * KW, other=0.0).to(tl.float32)
        acc += tl.sum(v * xk[None, :], axis=1)
    return acc


@triton.jit
def _moe_up_kernel(x_ptr, idx_ptr, wg_ptr, sg_ptr, gg_ptr, wu_ptr, su_ptr, gu_ptr, h_ptr, E, K_TOP, I, KW,
                   s_xt, s_we, s_se, BN: tl.constexpr, BKW: tl.constexpr, FIX_NAN: tl.constexpr):
    """Grid (pairs, row blocks of I): h[p, rows] = silu(gate) * up for pair p = t * K_TOP + j."""
    p = tl.program_id(0)
    r = tl.program_id(1) * BN + tl.arange(0, BN)
    t = p // K_TOP
    e = tl.load(idx_ptr + p).to(tl.int64)
    if (e >= 0) & (e < E):
        x_row = x_ptr + t.to(tl.int64) * s_xt
        gate = _rows_dot(wg_ptr + e * s_we, sg_ptr + e * s_se, x_row, r, I, KW, BN, BKW, FIX_NAN) * tl.load(gg_ptr + e)
        up = _rows_dot(wu_ptr + e * s_we, su_ptr + e * s_se, x_row, r, I, KW, BN, BKW, FIX_NAN) * tl.load(gu_ptr + e)
        gate = gate.to(h_ptr.dtype.element_ty).to(tl.float32)  # the projections' outputs in x's dtype, as a layer's
        up = up.to(h_ptr.dtype.element_ty).to(tl.float32)
        h = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(h_ptr + p.to(tl.int64) * I + r, h.to(h_ptr.dtype.element_ty), mask=r < I)


@triton.jit
def _moe_down_kernel(h_ptr, idx_ptr, wt_ptr, wd_ptr, sd_ptr, gd_ptr, y_ptr, E, K_TOP, H, KW, s_yt, s_we, s_se,
                     BN: tl.constexpr, BKW: tl.constexpr, FIX_NAN: tl.constexpr):
    """Grid (tokens, row blocks of H): y[t, rows] = sum_j w[t, j] * down_e(h[t, j]) (e = idx[t, j] in [0, E))."""
    t = tl.program_id(0)
    r = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BN], tl.float32)
    for j in range(K_TOP):
        p = t * K_TOP + j
        e = tl.load(idx_ptr + p).to(tl.int64)
        if (e >= 0) & (e < E):
            d = _rows_dot(wd_ptr + e * s_we, sd_ptr + e * s_se, h_ptr + p.to(tl.int64) * (16 * KW), r, H, KW, BN,
                          BKW, FIX_NAN)
            acc += d * tl.load(gd_ptr + e) * tl.load(wt_ptr + p).to(tl.float32)
    tl.store(y_ptr + t.to(tl.int64) * s_yt + r, acc.to(y_ptr.dtype.element_ty), mask=r < H)


def _check_proj(name: str, w: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], E: int, N: int, K: int) -> None:
    packed, scales, gs = w
    check_tensor(f"{name} packed", packed, dtypes=(torch.uint8,), ndim=3)
    check_tensor(f"{name} scales", scales, dtypes=(torch.float8_e4m3fn,), ndim=3)
    check_tensor(f"{name} global scales", gs, dtypes=(torch.float32,), ndim=1)
    if tuple(packed.shape) != (E, N, K // 2) or tuple(scales.shape) != (E, N, K // 16) or tuple(gs.shape) != (E,):
        raise ValueError(f"{name}: packed {tuple(packed.shape)}, scales {tuple(scales.shape)}, global scales "
                         f"{tuple(gs.shape)}; expected {(E, N, K // 2)}, {(E, N, K // 16)}, {(E,)}")
    if N % 16 or K % 256 or not packed.is_contiguous() or not scales.is_contiguous():
        raise ValueError(f"{name}: the tiled layout needs N % 16 == 0, K % 256 == 0 and contiguous stacks "
                         f"(N={N}, K={K})")


@torch.library.custom_op("llmkernels::nvfp4_moe", mutates_args=())
def _nvfp4_moe_op(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, wg: torch.Tensor,
                  sg: torch.Tensor, gg: torch.Tensor, wu: torch.Tensor, su: torch.Tensor, gu: torch.Tensor,
                  wd: torch.Tensor, sd: torch.Tensor, gd: torch.Tensor) -> torch.Tensor:
    return _moe(x, top_k_index, top_k_weights, wg, sg, gg, wu, su, gu, wd, sd, gd)


# the mma-fed kernels (moe_tiled) by default where they run: 13-37x the plain ones, 36-67 % of the floor at 1-16
# tokens (H200, Qwen3-30B / 235B layer shapes, benchmarks/notes/nvfp4_moe.md); LLMKERNELS_MOE_MMA=0: off
MMA = os.environ.get("LLMKERNELS_MOE_MMA", "1") != "0"


def _moe(x, top_k_index, top_k_weights, wg, sg, gg, wu, su, gu, wd, sd, gd, mma=None, grouped=None, tiles=True):
    """Scales as their bytes (uint8): the kernels decode them. grouped (None: past MOE_MAX_T tokens): the pairs
    sorted by expert, an expert's weights read once a tile (mma and tiles: moe_tiled_pairs, else moe_grouped), else
    one program group a pair: mma (None: MMA) the mma-fed kernels where they run (moe_tiled_usable), else the plain
    ones (the interpreter's). Every path takes any T (benchmarks and tests force them). tiles (False: moe_grouped on
    sm_90 too; 8 or 16: that many pairs a tile; for the benchmarks and tests)."""
    T, H = x.shape
    E, I = wg.shape[0], wg.shape[1]
    K_TOP = top_k_index.shape[1]
    if T == 0:
        return torch.empty_like(x)
    idx = top_k_index.contiguous()
    mma = (MMA if mma is None else mma) and moe_tiled_usable(x, K_TOP)
    if T > MOE_MAX_T if grouped is None else grouped:
        if mma and tiles:
            return moe_tiled_pairs(x, idx, top_k_weights.contiguous(), wg, sg, gg, wu, su, gu, wd, sd, gd,
                                   None if tiles is True else tiles)
        return moe_grouped(x, idx, top_k_weights.contiguous(), wg, sg, gg, wu, su, gu, wd, sd, gd)
    y = torch.empty_like(x)
    h = torch.empty(T * K_TOP, I, dtype=x.dtype, device=x.device)  # a dropped slot's row is never read
    if mma:
        return moe_tiled(x, idx, top_k_weights.contiguous(), wg, sg, gg, wu, su, gu, wd, sd, gd, y, h)
    BN, BKW, fix = 16, 4, interpreting()
    s_we, s_se = wg.stride(0) // 8, sg.stride(0)  # the kernels address the packed bytes as int64 words
    launch(_moe_up_kernel, (T * K_TOP, cdiv(I, BN)), x, idx, wg.view(torch.int64), sg, gg, wu.view(torch.int64), su,
           gu, h, E, K_TOP, I, H // 16, x.stride(0), s_we, s_se, BN=BN, BKW=BKW, FIX_NAN=fix, num_warps=4)
    launch(_moe_down_kernel, (T, cdiv(H, BN)), h, idx, top_k_weights.contiguous(), wd.view(torch.int64), sd, gd, y,
           E, K_TOP, H, I // 16, y.stride(0), wd.stride(0) // 8, sd.stride(0), BN=BN, BKW=BKW, FIX_NAN=fix,
           num_warps=4)
    return y


@_nvfp4_moe_op.register_fake
def _(x, top_k_index, top_k_weights, wg, sg, gg, wu, su, gu, wd, sd, gd):
    return torch.empty_like(x)


_SITE = "nvfp4_moe"  # a checked call's key -> True


def _flat(gate, up, down) -> tuple:
    """The op's weight arguments: each projection's (packed, scale bytes, global scales)."""
    return tuple(t for p, s, g in (gate, up, down) for t in (p, s.view(torch.uint8), g))


def nvfp4_moe(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate, up, down) -> torch.Tensor:
    """x [T, H] fp16 / bf16 (unit last stride), top_k_index [T, k] int, top_k_weights [T, k] float; gate, up:
    (packed uint8 [E, I, H/2], scales float8_e4m3fn [E, I, H/16], global scales fp32 [E]) in the tiled layout
    (NVFP4Linear's, stacked), down likewise [E, H, I/2] ... -> y [T, H] in x's dtype: each token's sum over its k
    chosen experts of weight * down(silu(gate(x)) * up(x)). Indices outside [0, E) add nothing. Errors name the
    argument. Eager calls repeating a checked call's shapes, strides, dtypes and devices skip the checks."""
    key = None if tracing() else (_SITE, current_device(),
                                  *map(tkey, (x, top_k_index, top_k_weights, *gate, *up, *down)))
    if kept_plan(key, (x, top_k_index, top_k_weights)):
        return _moe(x, top_k_index, top_k_weights, *_flat(gate, up, down))
    check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    T, H = x.shape
    if x.stride(1) != 1:
        raise ValueError(f"x must have a unit last stride, got strides {x.stride()}")
    check_tensor("top_k_index", top_k_index, dtypes=(torch.int32, torch.int64), ndim=2)
    check_tensor("top_k_weights", top_k_weights, dtypes=(torch.float16, torch.bfloat16, torch.float32), ndim=2)
    if top_k_index.shape[0] != T or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"top_k_index and top_k_weights must be [T={T}, k], got {tuple(top_k_index.shape)} and "
                         f"{tuple(top_k_weights.shape)}")
    E, I = gate[0].shape[0], gate[0].shape[1]
    _check_proj("gate", gate, E, I, H)
    _check_proj("up", up, E, I, H)
    _check_proj("down", down, E, H, I)
    check_same_device(x=x, top_k_index=top_k_index, top_k_weights=top_k_weights, gate=gate[0], up=up[0],
                      down=down[0])
    if keep_plan(key, lambda: True, (x, top_k_index, top_k_weights)):  # the custom op would only run _moe
        return _moe(x, top_k_index, top_k_weights, *_flat(gate, up, down))
    return _nvfp4_moe_op(x, top_k_index, top_k_weights, *_flat(gate, up, down))
