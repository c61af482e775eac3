"""nvfp4_moe for many tokens (prefill; batches past MOE_MAX_T) off sm_90: the (token, slot) pairs grouped by expert
on the device (expert_tiles, shared with moe_tiled_pairs: no host sync, CUDA-graph capturable), then a program per
(block of BN rows, tile of up to BT pairs of one expert) decodes the expert's weight tile (tiled_layout's recipe,
plain Triton: the interpreter runs it too) into a tl.dot against the pairs' rows, so an expert's weights are read
once per tile of its tokens. Up: h[pair] = silu(gate) * up (gate / up rounded to x's dtype first); down: o[pair] =
weight x down(h[pair]) in fp32, summed over each token's k slots after. The grid covers E + P / BT tiles, the most
any routing needs (P pairs); programs past the routing's own tiles exit."""
import math

import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._runtime import cdiv, interpreting
from .tiled_layout import tiled_values


@triton.jit
def _expert_of(w, tstart_ptr, E, LOG_E: tl.constexpr):
    """The expert whose tiles hold work tile w: the largest e < E with tstart[e] <= w (tstart: exclusive prefix sums
    of the experts' tile counts, so an expert with none is passed over)."""
    lo = 0
    hi = E
    for _ in tl.static_range(LOG_E):
        mid = (lo + hi) // 2
        go = tl.load(tstart_ptr + mid) <= w
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def _tile(w, order_ptr, pstart_ptr, tstart_ptr, E, BT: tl.constexpr, LOG_E: tl.constexpr):
    """(expert, its pairs [BT] in this tile, which of them exist) of work tile w (< the routing's tile count)."""
    e = _expert_of(w, tstart_ptr, E, LOG_E)
    q = tl.load(pstart_ptr + e) + (w - tl.load(tstart_ptr + e)) * BT + tl.arange(0, BT)
    ok = q < tl.load(pstart_ptr + e + 1)
    return e.to(tl.int64), tl.load(order_ptr + q, mask=ok, other=0).to(tl.int64), ok


@triton.jit
def _w_tile(w_ptr, s_ptr, rows, N, KW, kw0, DT: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr,
            FIX_NAN: tl.constexpr):
    """[BN, 16 BKW] in DT: rows of one expert's weight, words kw0 .. kw0 + BKW (e2m1 x scale: exact in fp16 / bf16)."""
    kw = kw0 + tl.arange(0, BKW)[None, :]
    return tiled_values(w_ptr, s_ptr, rows[:, None], kw, N, KW, 1.0, BN, BKW, FIX_NAN).to(DT)


@triton.jit
def _x_tile(x_ptr, xrow, ok, s_xt, KW, kw0, BKW: tl.constexpr):
    """[16 BKW, BT]: those columns of x's rows xrow (0 where not ok)."""
    kk = kw0 * 16 + tl.arange(0, 16 * BKW)[:, None]
    return tl.load(x_ptr + xrow[None, :] * s_xt + kk, mask=ok[None, :] & (kk < 16 * KW), other=0.0)


@triton.jit
def _grouped_up_kernel(x_ptr, order_ptr, pstart_ptr, tstart_ptr, wg_ptr, sg_ptr, gg_ptr, wu_ptr, su_ptr, gu_ptr,
                       h_ptr, E, K_TOP, I, KW, s_xt, s_we, s_se, BT: tl.constexpr, BN: tl.constexpr,
                       BKW: tl.constexpr, LOG_E: tl.constexpr, FIX_NAN: tl.constexpr):
    """Grid (I / BN, tiles): h[pair, rows] = silu(gate_e(x_t)) * up_e(x_t) for the tile's pairs (t = pair // K_TOP)."""
    DT: tl.constexpr = h_ptr.dtype.element_ty
    w = tl.program_id(1)
    if w < tl.load(tstart_ptr + E):
        e, pair, ok = _tile(w, order_ptr, pstart_ptr, tstart_ptr, E, BT, LOG_E)
        tok = pair // K_TOP
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        accg = tl.zeros([BN, BT], tl.float32)
        accu = tl.zeros([BN, BT], tl.float32)
        for kw0 in range(0, KW, BKW):
            xt = _x_tile(x_ptr, tok, ok, s_xt, KW, kw0, BKW)  # one load of the tokens' columns for gate and up
            accg = tl.dot(_w_tile(wg_ptr + e * s_we, sg_ptr + e * s_se, rows, I, KW, kw0, DT, BN, BKW, FIX_NAN), xt,
                          accg)
            accu = tl.dot(_w_tile(wu_ptr + e * s_we, su_ptr + e * s_se, rows, I, KW, kw0, DT, BN, BKW, FIX_NAN), xt,
                          accu)
        g = (accg * tl.load(gg_ptr + e)).to(DT).to(tl.float32)  # the projections' outputs in x's dtype, as a layer's
        u = (accu * tl.load(gu_ptr + e)).to(DT).to(tl.float32)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(h_ptr + pair[None, :] * I + rows[:, None], h.to(DT), mask=(rows[:, None] < I) & ok[None, :])


@triton.jit
def _grouped_down_kernel(h_ptr, order_ptr, pstart_ptr, tstart_ptr, rw_ptr, wd_ptr, sd_ptr, gd_ptr, o_ptr, E, H, KW,
                         s_we, s_se, BT: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr, LOG_E: tl.constexpr,
                         FIX_NAN: tl.constexpr):
    """Grid (H / BN, tiles): o[pair, rows] = rw[pair] * gd[e] * down_e(h[pair]) in fp32 for the tile's pairs."""
    DT: tl.constexpr = h_ptr.dtype.element_ty
    w = tl.program_id(1)
    if w < tl.load(tstart_ptr + E):
        e, pair, ok = _tile(w, order_ptr, pstart_ptr, tstart_ptr, E, BT, LOG_E)
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        acc = tl.zeros([BN, BT], tl.float32)
        for kw0 in range(0, KW, BKW):
            acc = tl.dot(_w_tile(wd_ptr + e * s_we, sd_ptr + e * s_se, rows, H, KW, kw0, DT, BN, BKW, FIX_NAN),
                         _x_tile(h_ptr, pair, ok, 16 * KW, KW, kw0, BKW), acc)
        scale = tl.load(rw_ptr + pair, mask=ok, other=0.0).to(tl.float32) * tl.load(gd_ptr + e)
        tl.store(o_ptr + pair[None, :] * H + rows[:, None], acc * scale[None, :],
                 mask=(rows[:, None] < H) & ok[None, :])


@triton.jit
def _pair_keys(idx_ptr, p0, P, E, BLOCK: tl.constexpr):
    """Pairs p0 .. p0 + BLOCK - 1 and their experts (E for a slot outside [0, E))."""
    offs = p0 + tl.arange(0, BLOCK)
    ids = tl.load(idx_ptr + offs, mask=offs < P, other=0)
    return offs, tl.where((ids >= 0) & (ids < E), ids, E).to(tl.int32)


@triton.jit
def _expert_tiles_kernel(idx_ptr, order_ptr, pstart_ptr, tstart_ptr, cursor_ptr, P, E, BT, BLOCK: tl.constexpr,
                         EB: tl.constexpr):
    """One program: the pairs' expert counts (bin E: slots outside [0, E); bin EB - 1: lanes past P), their
    exclusive sums (pstart) and tile starts (tstart), then each pair placed at its expert's next free slot of order
    (an atomic cursor a bin: the order within an expert is arbitrary, and no kernel's result depends on it)."""
    bins = tl.arange(0, EB)
    counts = tl.zeros([EB], tl.int32)
    for p0 in range(0, P, BLOCK):
        offs, key = _pair_keys(idx_ptr, p0, P, E, BLOCK)
        counts += tl.histogram(tl.where(offs < P, key, EB - 1), EB)
    start = tl.cumsum(counts, 0) - counts  # exclusive: start[E + 1] = P (bins past E + 1 hold lanes past P only)
    ntile = tl.where(bins < E, (counts + BT - 1) // BT, 0)
    tl.store(pstart_ptr + bins, start, mask=bins < E + 2)
    tl.store(tstart_ptr + bins, tl.cumsum(ntile, 0) - ntile, mask=bins < E + 1)
    tl.store(cursor_ptr + bins, start)
    tl.debug_barrier()  # the cursors' stores before any thread's atomics
    for p0 in range(0, P, BLOCK):
        offs, key = _pair_keys(idx_ptr, p0, P, E, BLOCK)
        at = tl.atomic_add(cursor_ptr + key, 1, mask=offs < P, sem="relaxed")  # unique slots, no ordering needed
        tl.store(order_ptr + at, offs, mask=offs < P)


def expert_tiles(idx, E: int, BT: int):
    """The (token, slot) pairs of idx [T, k] (contiguous) grouped by expert on the device, in tiles of up to BT
    pairs of one expert: (order int32 [P]: the pairs by expert, in any order within one; pstart int32 [E + 2]:
    expert e's pairs are order[pstart[e]:pstart[e + 1]]; tstart int32 [E + 1]: its tiles are tstart[e] ..
    tstart[e + 1] - 1, tstart[E] in all; the grid's tile count E + P / BT, the most any routing needs; LOG_E for
    _expert_of). Slots outside [0, E) sort last and get no tile. One launch (torch's sort and sums took ~12: 58 us
    of a 166 us layer at 32 tokens on the H200, against 2.9)."""
    P, dev = idx.numel(), idx.device
    tiles, log_e = E + cdiv(P, BT), max(1, math.ceil(math.log2(E + 1)))
    EB = triton.next_power_of_2(E + 2)
    out = torch.empty(P + 3 * EB, dtype=torch.int32, device=dev)  # order, pstart, tstart, cursors
    order, pstart, tstart, cursor = out[:P], out[P:P + E + 2], out[P + EB:P + EB + E + 1], out[P + 2 * EB:]
    launch(_expert_tiles_kernel, (1,), idx, order, pstart, tstart, cursor, P, E, BT, BLOCK=1024, EB=EB,
           num_warps=4)
    return order, pstart, tstart, tiles, log_e


def moe_grouped(x, idx, rw, wg, sg, gg, wu, su, gu, wd, sd, gd, BT: int = 64, BN: int = 64, BKW: int = 4):
    """nvfp4_moe's grouped path: x [T, H], idx [T, k] (contiguous), rw [T, k], the stacks as _moe takes them (uint8
    scales) -> y [T, H] in x's dtype."""
    T, H = x.shape
    E, I = wg.shape[0], wg.shape[1]
    k = idx.shape[1]
    P, dev = T * k, x.device
    order, pstart, tstart, tiles, log_e = expert_tiles(idx, E, BT)
    fix = interpreting()
    h = torch.empty(P, I, dtype=x.dtype, device=dev)  # rows of dropped slots: never written, never read
    launch(_grouped_up_kernel, (cdiv(I, BN), tiles), x, order, pstart, tstart, wg.view(torch.int64), sg, gg,
           wu.view(torch.int64), su, gu, h, E, k, I, H // 16, x.stride(0), wg.stride(0) // 8, sg.stride(0), BT=BT,
           BN=BN, BKW=BKW, LOG_E=log_e, FIX_NAN=fix, num_warps=4)
    o = torch.zeros(P, H, dtype=torch.float32, device=dev)  # dropped slots add 0
    launch(_grouped_down_kernel, (cdiv(H, BN), tiles), h, order, pstart, tstart, rw.reshape(-1),
           wd.view(torch.int64), sd, gd, o, E, H, I // 16, wd.stride(0) // 8, sd.stride(0), BT=BT, BN=BN, BKW=BKW,
           LOG_E=log_e, FIX_NAN=fix, num_warps=4)
    return o.view(T, k, H).sum(1).to(x.dtype)
