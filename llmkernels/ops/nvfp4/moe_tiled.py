"""nvfp4_moe on sm_90+: tiled.py's register-fed mma decode (its loads, decode and shared-memory sums) over stacked
experts, one program group per (token, slot) pair. Up: grid (block groups of gate / up, pairs); a pair's expert is
read from top_k_index on the device, warps as tiled's GLU kernel (blocks alternate gate / up, KS warps split K),
h[p] = silu(gate) * up in the epilogue. Down: grid (block groups of H, tokens); the KS >= k warps of a row block
take one slot each (all of its expert's K), scaled by routing weight x global scale, summed in shared memory: the
sum over experts without atomics or a second pass. One token a pair: 1 of the mma's 8 token columns is used (the
weights' bytes bound the time at decode sizes). Past nvfp4_moe's MOE_MAX_T tokens, moe_tiled_pairs: tiles of 8 or 16
pairs of one expert fill the mma's one or two groups of 8 token columns, so an expert's weights are decoded once a
tile."""
import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._pdl import pdl_enter, pdl_enabled
from ..._runtime import capability, cdiv, interpreting, next_pow2, planned_sms
from .moe_grouped import _expert_of, expert_tiles
from .tiled import _ld_iter, _pow2, _store_sum, _tiled_iter
from .tiled_layout import TILE_K, TILE_N


@triton.jit
def _stream(pw, ps, px0, px1, n, e, DT: tl.constexpr, LOADS: tl.constexpr, WIDE: tl.constexpr, NT: tl.constexpr = 1):
    """acc0 .. acc3 (rows r and r + 8 x token columns 2 (lane % 4) and + 1; NT 2: acc4 .. acc7 the same at columns
    + 8, activations at px1) over n iterations from pw / ps / px*; LOADS 2: the next iteration's words loaded before
    this one decodes (its last reload stays in range)."""
    acc0 = tl.zeros(e.shape, tl.float32)
    acc1, acc2, acc3, acc4, acc5, acc6, acc7 = acc0, acc0, acc0, acc0, acc0, acc0, acc0
    sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = _ld_iter(pw, ps)
    for it in range(0, n):
        adv = (it + 1 < n).to(tl.int64)
        pw += 256 * adv
        ps += 32 * adv
        if LOADS == 2:
            nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b = _ld_iter(pw, ps)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _tiled_iter(
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b, sv, px0, px1, DT,
            NT, WIDE)
        if LOADS == 2:
            sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b
        else:
            sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = _ld_iter(pw, ps)
        px0 += 64 * adv
        px1 += 64 * adv
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _glu_words(pid, e, lane, ex, wg_ptr, sg_ptr, wu_ptr, su_ptr, I, KI, per, s_we, s_se, R: tl.constexpr,
               KS: tl.constexpr):
    """Each lane's first weight words and scale word of expert ex's gate / up (blocks alternate gate / up, R blocks
    a program, KS warps splitting K into ranges of `per` iterations) and its range's first iteration."""
    blk = tl.minimum(pid * R + e // (32 * KS), 2 * (I // 16) - 1).to(tl.int64)  # past the end: read, not stored
    i_at = ((e // 32) % KS) * per
    up = blk % 2 == 1
    pw = tl.where(up, wu_ptr, wg_ptr) + ex * s_we + (((blk // 2) * KI + i_at) * 128 + lane) * 2
    ps = tl.where(up, su_ptr, sg_ptr) + ex * s_se + ((blk // 2) * KI + i_at) * 32 + lane
    return pw, ps, i_at


@triton.jit(do_not_specialize=["one"])
def _moe_up_mma(x_ptr, idx_ptr, wg_ptr, sg_ptr, gg_ptr, wu_ptr, su_ptr, gu_ptr, h_ptr, E, K_TOP, I, KI, per,
                s_xt, s_we, s_se, one, R: tl.constexpr, KS: tl.constexpr, LOADS: tl.constexpr, WIDE: tl.constexpr,
                USE_GDC: tl.constexpr, TRIGGER: tl.constexpr):
    """Grid (groups of R blocks of 16 rows over gate and up, pairs p = t K_TOP + j): h[p] = silu(gate_e(x_t)) *
    up_e(x_t) for e = idx[p], nothing stored where e lies outside [0, E). x_ptr, w*, s* int64 words; KS divides KI."""
    DT: tl.constexpr = h_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pdl_enter(USE_GDC, TRIGGER == 1)  # the routing comes from the previous kernels
    pid = tl.program_id(0)
    p = tl.program_id(1)
    ex = tl.load(idx_ptr + p).to(tl.int64)
    ok = (ex >= 0) & (ex < E)
    ex = tl.where(ok, ex, 0)
    e = tl.arange(0, 32 * W)
    lane = (e % 32) * one
    pw, ps, i_at = _glu_words(pid, e, lane, ex, wg_ptr, sg_ptr, wu_ptr, su_ptr, I, KI, per, s_we, s_se, R, KS)
    px = x_ptr + (p // K_TOP) * s_xt + 4 * (16 * i_at + lane % 4)
    acc0, _, acc2, _, _, _, _, _ = _stream(pw, ps, px, px, per, e, DT, LOADS, WIDE)
    if USE_GDC and TRIGGER == 2:
        tl.extra.cuda.gdc_launch_dependents()
    g = tl.arange(0, 32)
    t0 = (2 * (g % 4))[None, :]
    row = pid * (8 * R) + tl.arange(0, R // 2)[:, None] * 16 + (g // 4)[None, :]
    n_tok = ok.to(tl.int32)  # 1, or 0: nothing stored
    y = h_ptr + p.to(tl.int64) * I
    _store_sum(acc0, row, t0, n_tok, 2 * I, gg_ptr + ex, gg_ptr, gu_ptr + ex, gu_ptr, y, I, one, R, KS, False, True)
    _store_sum(acc2, row + 8, t0, n_tok, 2 * I, gg_ptr + ex, gg_ptr, gu_ptr + ex, gu_ptr, y, I, one, R, KS, False,
               True)


@triton.jit
def _store_slots(acc, row, t0, N, y_ptr, one, R: tl.constexpr, KS: tl.constexpr):
    """The sum of one accumulator over the KS slot warps of each row block (in shared memory; the scales applied),
    token column 0 stored at rows `row` < N of y."""
    v = tl.sum(tl.reshape(acc, [R, KS, 32]), axis=1) * 128.0  # the decode's 2^-7 (exact)
    tl.store(y_ptr + row * one, v.to(y_ptr.dtype.element_ty), mask=(row < N) & (t0 == 0))


@triton.jit(do_not_specialize=["one"])
def _moe_down_mma(h_ptr, idx_ptr, rw_ptr, wd_ptr, sd_ptr, gd_ptr, y_ptr, E, K_TOP, H, KI, s_ht, s_yt, s_we, s_se,
                  one, R: tl.constexpr, KS: tl.constexpr, LOADS: tl.constexpr, WIDE: tl.constexpr,
                  USE_GDC: tl.constexpr, TRIGGER: tl.constexpr):
    """Grid (groups of R blocks of 16 rows of H, tokens t): y[t] = sum_j rw[t, j] gd[e] down_e(h[t K_TOP + j]),
    e = idx[t, j]; warp KS r + j takes block R pid + r and slot j (slots past K_TOP or outside [0, E) add 0)."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pdl_enter(USE_GDC, TRIGGER == 1)
    pid = tl.program_id(0)
    t = tl.program_id(1)
    e = tl.arange(0, 32 * W)
    lane = (e % 32) * one
    blk = tl.minimum(pid * R + e // (32 * KS), H // 16 - 1).to(tl.int64)
    j = (e // 32) % KS
    pair = t * K_TOP + tl.minimum(j, K_TOP - 1)
    ex = tl.load(idx_ptr + pair).to(tl.int64)
    ok = (j < K_TOP) & (ex >= 0) & (ex < E)
    ex = tl.where(ok, ex, 0)
    scale = tl.load(rw_ptr + pair).to(tl.float32) * tl.load(gd_ptr + ex)
    pw = wd_ptr + ex * s_we + ((blk * KI) * 128 + lane) * 2
    ps = sd_ptr + ex * s_se + (blk * KI) * 32 + lane
    px = h_ptr + pair.to(tl.int64) * s_ht + 4 * (lane % 4)
    acc0, _, acc2, _, _, _, _, _ = _stream(pw, ps, px, px, KI, e, DT, LOADS, WIDE)
    if USE_GDC and TRIGGER == 2:
        tl.extra.cuda.gdc_launch_dependents()
    acc0 = tl.where(ok, acc0 * scale, 0.0)  # where, not a product: a dropped slot's h row is never written
    acc2 = tl.where(ok, acc2 * scale, 0.0)
    g = tl.arange(0, 32)
    t0 = (2 * (g % 4))[None, :]
    row = pid * (16 * R) + tl.arange(0, R)[:, None] * 16 + (g // 4)[None, :]
    yt = y_ptr + t.to(tl.int64) * s_yt
    _store_slots(acc0, row, t0, H, yt, one, R, KS)
    _store_slots(acc2, row + 8, t0, H, yt, one, R, KS)


@triton.jit
def _tile_cols(w, lane, order_ptr, pstart_ptr, tstart_ptr, E, LOG_E: tl.constexpr, NT: tl.constexpr):
    """Work tile w's expert (int64), its first pair's place q0 in order (tiles of 8 NT pairs), the end of the
    expert's pairs, and each lane's pairs in the NT groups of 8 token columns (column lane // 4 (+ 8); a column past
    the tile's pairs repeats its last one, never stored)."""
    ex = _expert_of(w, tstart_ptr, E, LOG_E)
    q0 = tl.load(pstart_ptr + ex) + (w - tl.load(tstart_ptr + ex)) * (8 * NT)
    q_end = tl.load(pstart_ptr + ex + 1)
    pair0 = tl.load(order_ptr + tl.minimum(q0 + lane // 4, q_end - 1)).to(tl.int64)
    pair1 = pair0
    if NT == 2:
        pair1 = tl.load(order_ptr + tl.minimum(q0 + 8 + lane // 4, q_end - 1)).to(tl.int64)
    return ex.to(tl.int64), q0, q_end, pair0, pair1


@triton.jit
def _col_pairs(order_ptr, q0, q_end, P):
    """The pairs of the accumulators' token columns 2 (lane % 4) and + 1 from q0, as [1, 32]; P where a column is
    empty."""
    c = q0 + (2 * (tl.arange(0, 32) % 4))[None, :]
    return (tl.load(order_ptr + c, mask=c < q_end, other=P).to(tl.int64),
            tl.load(order_ptr + c + 1, mask=c + 1 < q_end, other=P).to(tl.int64))


@triton.jit
def _store_glu_cols(acc0, acc1, acc2, acc3, row, order_ptr, q0, q_end, P, I, gg, gg_ptr, gu, gu_ptr, h_ptr, one,
                    R: tl.constexpr, KS: tl.constexpr):
    """h rows of one group of 8 token columns (from q0): silu(gate) * up per column's pair."""
    p0, p1 = _col_pairs(order_ptr, q0, q_end, P)
    _store_sum(acc0, row, p0, P, 2 * I, gg, gg_ptr, gu, gu_ptr, h_ptr, I, one, R, KS, False, True)
    _store_sum(acc1, row, p1, P, 2 * I, gg, gg_ptr, gu, gu_ptr, h_ptr, I, one, R, KS, False, True)
    _store_sum(acc2, row + 8, p0, P, 2 * I, gg, gg_ptr, gu, gu_ptr, h_ptr, I, one, R, KS, False, True)
    _store_sum(acc3, row + 8, p1, P, 2 * I, gg, gg_ptr, gu, gu_ptr, h_ptr, I, one, R, KS, False, True)


# The tiles' kernels take KI and per as runtime ints: specialised to 1 (a down K of 256, I = 256), the down kernel
# summed wrong columns (H200, triton 3.6: about half of o wrong, the same arguments unspecialised exact; the up
# kernel's h exact). Not understood: the per-pair kernels, whose token columns are all one token, would not show it.
@triton.jit(do_not_specialize=["one", "KI", "per"])
def _moe_up_tiles(x_ptr, order_ptr, pstart_ptr, tstart_ptr, wg_ptr, sg_ptr, gg_ptr, wu_ptr, su_ptr, gu_ptr, h_ptr,
                  E, K_TOP, I, KI, per, P, s_xt, s_we, s_se, one, R: tl.constexpr, KS: tl.constexpr,
                  LOG_E: tl.constexpr, WIDE: tl.constexpr, NT: tl.constexpr = 1):
    """Grid (groups of R blocks of 16 rows over gate and up, work tiles): a tile's up to 8 NT pairs of one expert
    (moe_grouped.expert_tiles with BT 8 NT) are the mma's NT groups of 8 token columns, so the expert's weights are
    decoded once for them: h[p] = silu(gate_e(x_t)) * up_e(x_t), t = p // K_TOP. Warps as _moe_up_mma's."""
    DT: tl.constexpr = h_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pid = tl.program_id(0)
    w = tl.program_id(1)
    if w < tl.load(tstart_ptr + E):  # tiles past the routing's own: nothing to do
        e = tl.arange(0, 32 * W)
        lane = (e % 32) * one
        ex, q0, q_end, pair0, pair1 = _tile_cols(w, lane, order_ptr, pstart_ptr, tstart_ptr, E, LOG_E, NT)
        pw, ps, i_at = _glu_words(pid, e, lane, ex, wg_ptr, sg_ptr, wu_ptr, su_ptr, I, KI, per, s_we, s_se, R, KS)
        k0 = 4 * (16 * i_at + lane % 4)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _stream(
            pw, ps, x_ptr + (pair0 // K_TOP) * s_xt + k0, x_ptr + (pair1 // K_TOP) * s_xt + k0, per, e, DT, 1, WIDE,
            NT)
        g = tl.arange(0, 32)
        row = pid * (8 * R) + tl.arange(0, R // 2)[:, None] * 16 + (g // 4)[None, :]
        gg, gu = gg_ptr + ex, gu_ptr + ex
        _store_glu_cols(acc0, acc1, acc2, acc3, row, order_ptr, q0, q_end, P, I, gg, gg_ptr, gu, gu_ptr, h_ptr, one,
                        R, KS)
        if NT == 2:
            _store_glu_cols(acc4, acc5, acc6, acc7, row, order_ptr, q0 + 8, q_end, P, I, gg, gg_ptr, gu, gu_ptr,
                            h_ptr, one, R, KS)


@triton.jit
def _store_pairs(acc, row, p, scale, P, N, o_ptr, one, R: tl.constexpr, KS: tl.constexpr):
    """One accumulator summed over the KS warps that split K, times the decode's 2^-7 and scale [1, 32], stored in
    fp32 at o[p, row] for the columns' pairs p < P."""
    if KS == 1:
        v = tl.reshape(acc, [R, 32])
    else:
        v = tl.sum(tl.reshape(acc, [R, KS, 32]), axis=1)
    tl.store(o_ptr + p * N + row * one, v * (128.0 * scale), mask=(row < N) & (p < P))


@triton.jit
def _store_down_cols(acc0, acc1, acc2, acc3, row, order_ptr, q0, q_end, P, H, rw_ptr, gd, o_ptr, one,
                     R: tl.constexpr, KS: tl.constexpr):
    """o rows of one group of 8 token columns (from q0): rw[p] gd down(h[p]) per column's pair."""
    p0, p1 = _col_pairs(order_ptr, q0, q_end, P)
    s0 = tl.load(rw_ptr + p0, mask=p0 < P, other=0.0).to(tl.float32) * gd
    s1 = tl.load(rw_ptr + p1, mask=p1 < P, other=0.0).to(tl.float32) * gd
    _store_pairs(acc0, row, p0, s0, P, H, o_ptr, one, R, KS)
    _store_pairs(acc1, row, p1, s1, P, H, o_ptr, one, R, KS)
    _store_pairs(acc2, row + 8, p0, s0, P, H, o_ptr, one, R, KS)
    _store_pairs(acc3, row + 8, p1, s1, P, H, o_ptr, one, R, KS)


@triton.jit(do_not_specialize=["one", "KI", "per"])  # KI, per: see _moe_up_tiles
def _moe_down_tiles(h_ptr, order_ptr, pstart_ptr, tstart_ptr, rw_ptr, wd_ptr, sd_ptr, gd_ptr, o_ptr, dt_ptr, E, H, KI,
                    per, P, s_ht, s_we, s_se, one, R: tl.constexpr, KS: tl.constexpr, LOG_E: tl.constexpr,
                    NT: tl.constexpr = 1):
    """Grid (groups of R blocks of 16 rows of H, work tiles): o[p] = rw[p] gd[e] down_e(h[p]) in fp32 for a tile's
    up to 8 NT pairs of one expert (the mma's token columns); KS warps split K (I) and sum in shared memory. The sum
    over each token's slots is the caller's. dt_ptr: a tensor of h's dtype (h_ptr is its int64 words)."""
    DT: tl.constexpr = dt_ptr.dtype.element_ty
    W: tl.constexpr = R * KS
    pid = tl.program_id(0)
    w = tl.program_id(1)
    if w < tl.load(tstart_ptr + E):
        e = tl.arange(0, 32 * W)
        lane = (e % 32) * one
        ex, q0, q_end, pair0, pair1 = _tile_cols(w, lane, order_ptr, pstart_ptr, tstart_ptr, E, LOG_E, NT)
        blk = tl.minimum(pid * R + e // (32 * KS), H // 16 - 1).to(tl.int64)
        i_at = ((e // 32) % KS) * per
        pw = wd_ptr + ex * s_we + ((blk * KI + i_at) * 128 + lane) * 2
        ps = sd_ptr + ex * s_se + (blk * KI + i_at) * 32 + lane
        k0 = 4 * (16 * i_at + lane % 4)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _stream(
            pw, ps, h_ptr + pair0 * s_ht + k0, h_ptr + pair1 * s_ht + k0, per, e, DT, 1, True, NT)
        gd = tl.load(gd_ptr + ex)
        g = tl.arange(0, 32)
        row = pid * (16 * R) + tl.arange(0, R)[:, None] * 16 + (g // 4)[None, :]
        _store_down_cols(acc0, acc1, acc2, acc3, row, order_ptr, q0, q_end, P, H, rw_ptr, gd, o_ptr, one, R, KS)
        if NT == 2:
            _store_down_cols(acc4, acc5, acc6, acc7, row, order_ptr, q0 + 8, q_end, P, H, rw_ptr, gd, o_ptr, one, R,
                             KS)


def _wide(x) -> bool:
    """x's rows load as 16-byte words (the mma kernels' WIDE)."""
    return x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0


def moe_tiled_usable(x: torch.Tensor, k: int) -> bool:
    """sm_90+ (the tiled mma decode), up to 16 slots a token, 8-byte aligned activation rows with unit stride."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return k <= 16 and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0


def _mma_plan(units: int, rows: int, KI: int, device):
    """(R, KS, per): about 32 warps an SM over the row blocks of `units` pairs (or tiles) of `rows` output rows
    each (gate and up: 2 I; down: H), KS a power of 2 dividing KI with at least 2 iterations a warp (tiled_config's
    rule), R even (the up kernels' blocks alternate gate / up)."""
    want = 32 * planned_sms(None, device) / max(units * rows // TILE_N, 1)
    ks = max(1, min(_pow2(want, False), 16, _pow2(max(KI // 2, 1), False)))
    while KI % ks:
        ks //= 2
    return max(2, 4 // ks), ks, KI // ks


def moe_tiled(x, idx, rw, wg, sg, gg, wu, su, gu, wd, sd, gd, y, h):
    """nvfp4_moe's two launches on the mma kernels (moe_tiled_usable(x)); stacks as _moe takes them (uint8 scales);
    h [T k, I] the intermediate, y [T, H] the output."""
    T, H = x.shape
    E, I = wg.shape[0], wg.shape[1]
    k = idx.shape[1]
    pdl = pdl_enabled(x.device)
    opts = dict(USE_GDC=pdl, TRIGGER=1, **({"launch_pdl": True} if pdl else {}))
    wide = _wide(x)
    r, ks, per = _mma_plan(T * k, 2 * I, H // TILE_K, x.device)
    launch(_moe_up_mma, (cdiv(2 * I // TILE_N, r), T * k), x.view(torch.int64), idx, wg.view(torch.int64),
           sg.view(torch.int64), gg, wu.view(torch.int64), su.view(torch.int64), gu, h, E, k, I, H // TILE_K, per,
           x.stride(0) // 4, wg.stride(0) // 8, sg.stride(0) // 8, 1, R=r, KS=ks, LOADS=1, WIDE=wide,
           num_warps=r * ks, **opts)
    ks = next_pow2(k)  # one warp a slot, padded slots add 0
    r = max(1, 4 // ks)
    launch(_moe_down_mma, (cdiv(H // TILE_N, r), T), h.view(torch.int64), idx, rw, wd.view(torch.int64),
           sd.view(torch.int64), gd, y, E, k, H, I // TILE_K, I // 4, y.stride(0), wd.stride(0) // 8,
           sd.stride(0) // 8, 1, R=r, KS=ks, LOADS=1, WIDE=True, num_warps=r * ks, **opts)
    return y


# Tiles of 16 pairs (the mma's two groups of 8 token columns: an expert's weights decoded and read from L2 once per
# 16 pairs) from this many pairs an expert on average, else 8 (a tile of fewer pairs pays the second group's mma for
# nothing). H200, 30B / 235B layers, 16 against 8, us: T 64 197 / 481 vs 181 / 427, T 128 215 / 524 vs 210 / 530,
# T 256 274 / 713 vs 288 / 818, T 1024 689 / 2066 vs 817 / 2638 (benchmarks/notes/nvfp4_moe.md).
PAIRS_FOR_16 = 16


def moe_tiled_pairs(x, idx, rw, wg, sg, gg, wu, su, gu, wd, sd, gd, bt=None):
    """nvfp4_moe's grouped path on sm_90 (moe_tiled_usable(x); past MOE_MAX_T tokens): the pairs sorted by expert in
    tiles of bt (8 or 16; None: 16 from PAIRS_FOR_16 pairs an expert), each tile's pairs the mma's token columns (an
    expert's weights decoded once a tile, not once a pair); stacks as _moe takes them -> y [T, H] in x's dtype (the
    slots' fp32 outputs summed)."""
    T, H = x.shape
    E, I = wg.shape[0], wg.shape[1]
    k = idx.shape[1]
    P = T * k
    bt = bt or (16 if P >= PAIRS_FOR_16 * E else 8)
    order, pstart, tstart, tiles, log_e = expert_tiles(idx, E, bt)
    busy = min(tiles, P // bt + min(E, P))  # tiles a routing fills, about (the grid covers the most any needs)
    wide = _wide(x)
    h = torch.empty(P, I, dtype=x.dtype, device=x.device)  # rows of dropped slots: never written, never read
    r, ks, per = _mma_plan(busy, 2 * I, H // TILE_K, x.device)
    launch(_moe_up_tiles, (cdiv(2 * I // TILE_N, r), tiles), x.view(torch.int64), order, pstart, tstart,
           wg.view(torch.int64), sg.view(torch.int64), gg, wu.view(torch.int64), su.view(torch.int64), gu, h, E, k,
           I, H // TILE_K, per, P, x.stride(0) // 4, wg.stride(0) // 8, sg.stride(0) // 8, 1, R=r, KS=ks,
           LOG_E=log_e, WIDE=wide, NT=bt // 8, num_warps=r * ks)
    o = torch.zeros(P, H, dtype=torch.float32, device=x.device)  # dropped slots add 0
    r, ks, per = _mma_plan(busy, H, I // TILE_K, x.device)
    launch(_moe_down_tiles, (cdiv(H // TILE_N, r), tiles), h.view(torch.int64), order, pstart, tstart,
           rw.reshape(-1), wd.view(torch.int64), sd.view(torch.int64), gd, o, x, E, H, I // TILE_K, per, P, I // 4,
           wd.stride(0) // 8, sd.stride(0) // 8, 1, R=r, KS=ks, LOG_E=log_e, NT=bt // 8, num_warps=r * ks)
    return o.view(T, k, H).sum(1).to(x.dtype)
