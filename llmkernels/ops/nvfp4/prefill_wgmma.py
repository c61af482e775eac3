"""NVFP4 linear prefill on sm_90 (Gluon, warp-specialised): y^T = W x^T on wgmma with the decoded weights as the A
operand straight from registers and the activations as B from a shared-memory ring.

A program takes 128 rows (two consumer warpgroups of 64: 4 row blocks of the tiled layout, a warp each) x BT tokens
over a range of K. Each step (64 K) a consumer lane loads the 16 bytes the decode kernel's lane loads (words c of its
rows g and g + 8, tiled.py) and decodes them with the same pair recipe into exactly its wgmma A fragment (4 k16
chunks x a0..a3), so no layout conversion or shared-memory pass touches the weights. The fragment's K order is the
words' (lane c holds word c), not x's: x is permuted once per call (permute_x) so that B's row k' holds x's column
of the same k. A producer warpgroup TMA-loads x' tiles [BT, 64] into the ring (TMA writes through the async proxy,
as wgmma reads: no proxy fence before each product, which the cp.async ring needed; notes linear round 22).
"""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._gluon import HAVE_GLUON, TensorDescriptor, gl, gluon, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from ..._launch import Launch, launch
from ..._runtime import capability, cdiv, interpreting, planned_sms
from .linear import MMA_MAX_T, _reduce_linear, reduce_plan
from .tiled_layout import TILE_K, _u8, asm_chunk


def _asm_step(bf16: bool, u: int) -> str:
    """PTX: a step's words of rows g ($16) and g + 8 ($17) and the iteration's scale word ($18: this step's scales in
    bytes 2u, 2u + 1) -> the step's A fragments $0..$15 (k16 chunk kk: 4 kk + (a0, a1, a2, a3) = (row g pair 2kk,
    row g + 8 pair 2kk, row g pair 2kk + 1, row g + 8 pair 2kk + 1)), E2M1 x scale x 2^-7 exact, as the tiled
    kernel's decode. cvt.rn.f16x2.e4m3x2 takes both scales at once (exact; NaN stays NaN)."""
    s = ("{\n.reg .b32 lo0, hi0, lo1, hi1, slo, shi, sf, sc0, sc1, t;\n.reg .b16 s16, h0, h1;\n.reg .f32 f0, f1;\n"
         "mov.b64 {lo0, hi0}, $16;\nmov.b64 {lo1, hi1}, $17;\nmov.b64 {slo, shi}, $18;\n")
    src = "slo" if u < 2 else "shi"
    s += f"shr.u32 sf, {src}, 16;\n" if u % 2 else f"mov.b32 sf, {src};\n"
    s += "cvt.u16.u32 s16, sf;\ncvt.rn.f16x2.e4m3x2 sf, s16;\n"
    if bf16:  # scale x 2^119 in bf16 (exact: 448 x 2^119 < 2^128)
        s += ("mov.b32 {h0, h1}, sf;\ncvt.f32.f16 f0, h0;\ncvt.f32.f16 f1, h1;\n"
              "mul.f32 f0, f0, 0f7B000000;\nmul.f32 f1, f1, 0f7B000000;\n"
              "cvt.rn.bf16x2.f32 sc0, f0, f0;\ncvt.rn.bf16x2.f32 sc1, f1, f1;\n")
    else:  # scale x 2^7 in fp16 (exact: 448 x 2^7 < 65504)
        s += ("mov.b32 t, 0x58005800;\nmul.rn.f16x2 sf, sf, t;\nmov.b32 {h0, h1}, sf;\n"
              "mov.b32 sc0, {h0, h0};\nmov.b32 sc1, {h1, h1};\n")
    return s + "".join(asm_chunk(kk, [f"${4 * kk + slot}" for slot in range(4)], bf16) for kk in range(4)) + "}"


@triton.jit
def _permute_x_kernel(x_ptr, out_ptr, T, TP, K, s_x, BR: tl.constexpr, BK: tl.constexpr):
    """out [TP, K] (contiguous) = x with each 64 columns in the fragments' K order (permute_x), as 4-byte pairs; rows
    T..TP-1 zero."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)[:, None]
    q = tl.program_id(1) * (BK // 2) + tl.arange(0, BK // 2)[None, :]  # pair of out: 32 j + 8 kk + 4 ph + c
    src = (q // 32) * 32 + 8 * (q % 4) + 2 * ((q // 8) % 4) + (q // 4) % 2
    ok = q < K // 2
    v = tl.load(x_ptr + r.to(tl.int64) * (s_x // 2) + src, mask=ok & (r < T), other=0)
    tl.store(out_ptr + r.to(tl.int64) * (K // 2) + q, v, mask=ok & (r < TP))


_PERM = dict(BR=16, BK=256, num_warps=4)


def _perm_grid(T: int, K: int):
    return cdiv(T, _PERM["BR"]), cdiv(K, _PERM["BK"])


def _pairs_ok(x: torch.Tensor) -> bool:
    """permute_x reads x as 4-byte pairs: an even row stride and a 4-byte aligned start (else it reads a copy)."""
    return x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0


def permute_x(x: torch.Tensor, rows: int = 0) -> torch.Tensor:
    """x [T, K] -> x' [max(rows, T), K] with x'[:, 64 j + 16 kk + 8 ph + 2 c + e] = x[:, 64 j + 16 c + 4 kk + 2 ph + e]:
    the K order of the A fragments (lane c holds word c of a step, pair 2 kk + ph of it in k16 chunk kk); rows past T
    zero (whole token tiles for the TMA loads: boxes mostly past the end ran 1.5x slower, round 22). x's rows 4-byte
    aligned."""
    T, K = x.shape
    TP = max(rows, T)
    out = torch.empty(TP, K, dtype=x.dtype, device=x.device)
    launch(_permute_x_kernel, _perm_grid(TP, K), x.view(torch.int32), out.view(torch.int32), T, TP, K, x.stride(0),
           **_PERM)
    return out


if HAVE_GLUON:
    _ASMS = gl.constexpr(tuple(_asm_step(bf16, u) for bf16 in (False, True) for u in range(4)))

    @gluon.jit
    def _decode(wt, wb, sv, u: gl.constexpr, BF16: gl.constexpr):
        """_asm_step(BF16, u) on one step's words."""
        return gl.inline_asm_elementwise(_ASMS[4 * BF16 + u], "=r," * 16 + "l,l,l", [wt, wb, sv],
                                         dtype=(gl.int32,) * 16, is_pure=True, pack=1)

    @gluon.jit
    def _ld2(p):
        """Two int64 words at p (16 bytes, read-only path)."""
        return gl.inline_asm_elementwise("ld.global.nc.v2.b64 {$0, $1}, [$2];", "=l,=l,l",
                                         [p.to(gl.int64, bitcast=True)], dtype=(gl.int64, gl.int64), is_pure=True,
                                         pack=1)

    @gluon.jit
    def _ld1(p):
        return gl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [p.to(gl.int64, bitcast=True)],
                                         dtype=gl.int64, is_pure=True, pack=1)

    @gluon.jit
    def _l2_prefetch(pw, ps, ok):
        """Lane 0 of each warp: the warp's 2 KB of words and 256 bytes of scales of an iteration into L2."""
        return gl.inline_asm_elementwise(
            "{\n.reg .pred p;\n.reg .u32 l;\nmov.u32 l, %laneid;\nsetp.eq.u32 p, l, 0;\nsetp.ne.and.s32 p, $3, 0, p;\n"
            "@p cp.async.bulk.prefetch.L2.global [$1], 2048;\n@p cp.async.bulk.prefetch.L2.global [$2], 256;\n"
            "mov.u32 $0, 0;\n}", "=r,l,l,r", [pw.to(gl.int64, bitcast=True), ps.to(gl.int64, bitcast=True), ok],
            dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _j4(a, b, c, d):
        """[..] x 4 -> [.., 2, 2], value i at [i // 2, i % 2]."""
        return gl.join(gl.join(a, c), gl.join(b, d))

    @gluon.jit
    def _fragments(wt, wb, sv, u: gl.constexpr, DT: gl.constexpr, a_l: gl.constexpr):
        """One step's words ([4 warps, 8 g, 4 c] each) -> the warpgroup's A operand [64 rows, 64 k'] in a_l, built
        by joins whose register order is the fragment's (e, row + 8, k' + 8, chunk), so the conversion is free."""
        o = _decode(wt, wb, sv, u, DT == gl.bfloat16)
        # o[4 kk + slot]; slot = h + 2 ph. Joins: kk (2 bits), then ph, then h, then the bf16 halves (e)
        k0 = _j4(o[0], o[4], o[8], o[12])
        k1 = _j4(o[1], o[5], o[9], o[13])
        k2 = _j4(o[2], o[6], o[10], o[14])
        k3 = _j4(o[3], o[7], o[11], o[15])
        h = gl.join(gl.join(k0, k2), gl.join(k1, k3))  # [w, g, c, kk1, kk0, ph, h]
        lo = (h & 0xFFFF).to(gl.int16).to(DT, bitcast=True)
        hi = (h >> 16).to(gl.int16).to(DT, bitcast=True)
        v = gl.join(lo, hi)  # [w, g, c, kk1, kk0, ph, h, e]
        v = gl.permute(v, (0, 6, 1, 3, 4, 5, 2, 7))  # [w, h, g, kk1, kk0, ph, c, e]
        return gl.convert_layout(gl.reshape(v, [64, 64]), a_l, assert_trivial=True)

    @gluon.jit
    def _piece(KI, per, R0, S):
        """(row tile, split, first iteration, iterations) of this program: row tiles below R0 run whole K, the rest
        in S pieces of per iterations (grid axis 1: R0 tiles, then S pieces of each later tile)."""
        p = gl.program_id(1)
        j = gl.maximum(p - R0, 0)
        split = j % S
        it0 = split * per
        if p < R0:
            return p, split, it0, KI
        return R0 + j // S, split, it0, gl.minimum(per, KI - it0)

    @gluon.jit
    def _consumer(w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr, x_s, full, empty, T, N, KI, per, R0, S, s_yt,
                  CID: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, PARTIAL: gl.constexpr,
                  HAS_BIAS: gl.constexpr, L2PF: gl.constexpr):
        """One warpgroup: rows [64 CID, 64 CID + 64) of the program's 128, every step of its K range."""
        DT: gl.constexpr = x_s.dtype
        mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
        l3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 8, 4], [4, 1, 1], [2, 1, 0])
        pid_t = gl.program_id(0)
        pid_n, split, it0, n_it = _piece(KI, per, R0, S)
        wi = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, l3)))[:, None, None]
        gi = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))[None, :, None]
        ci = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))[None, None, :]
        blk = gl.minimum(pid_n * 8 + CID * 4 + wi, N // 16 - 1).to(gl.int64)  # blocks past N: read, not stored
        lane = 4 * gi + ci
        pw = w_ptr + ((blk * KI + it0) * 128 + lane) * 2  # an iteration: 4 steps x 32 lanes x 2 words
        ps = s_ptr + (blk * KI + it0) * 32 + lane
        sv = _ld1(ps)
        w0t, w0b = _ld2(pw)
        w1t, w1b = _ld2(pw + 64)
        w2t, w2b = _ld2(pw + 128)
        w3t, w3b = _ld2(pw + 192)
        acc = gl.zeros([64, BT], gl.float32, mma_l)
        for i in range(n_it):
            adv = (i + 1 < n_it).to(gl.int64)  # the last iteration reloads its own words (valid addresses)
            pw += 256 * adv
            ps += 32 * adv
            if L2PF > 0:
                _l2_prefetch(pw + (L2PF - 1) * 256, ps + (L2PF - 1) * 32, (i + L2PF < n_it).to(gl.int32))
            nsv = _ld1(ps)
            n0t, n0b = _ld2(pw)
            n1t, n1b = _ld2(pw + 64)
            n2t, n2b = _ld2(pw + 128)
            n3t, n3b = _ld2(pw + 192)
            for u in gl.static_range(4):
                if u == 0:
                    a = _fragments(w0t, w0b, sv, 0, DT, a_l)
                elif u == 1:
                    a = _fragments(w1t, w1b, sv, 1, DT, a_l)
                elif u == 2:
                    a = _fragments(w2t, w2b, sv, 2, DT, a_l)
                else:
                    a = _fragments(w3t, w3b, sv, 3, DT, a_l)
                step = 4 * i + u
                s = step % STAGES
                mbarrier.wait(full.index(s), (step // STAGES) & 1)  # TMA wrote it: no proxy fence
                acc = warpgroup_mma(a, x_s.index(s).permute((1, 0)), acc, is_async=True)
                if u < 3:  # the previous step's product is done (this one runs on while the next decodes)
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                    if u > 0:  # ... so its slot is free for this consumer: a barrier, then one arrival
                        gl.thread_barrier()
                        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1)
                else:  # every product of the iteration is done (one in flight across the loop's back edge made
                    # ptxas serialise every wgmma: "insufficient register resources")
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    gl.thread_barrier()
                    mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1)
                    mbarrier.arrive(empty.index(s), count=1)
            sv, w0t, w0b, w1t, w1b, w2t, w2b, w3t, w3b = nsv, n0t, n0b, n1t, n1b, n2t, n2b, n3t, n3b
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        st_l: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
        rows = pid_n * 128 + CID * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))[:, None]
        toks = pid_t * BT + gl.arange(0, BT, layout=gl.SliceLayout(0, st_l))[None, :]
        ok = (rows < N) & (toks < T)
        if PARTIAL and pid_n >= R0:  # a piece: fp32 sums to part [S, T, N - 128 R0]
            pv = gl.convert_layout(acc * 128.0, st_l)  # the decode's 2^-7 (exact)
            gl.store(part_ptr + (split * T + toks.to(gl.int64)) * (N - 128 * R0) + rows - 128 * R0, pv, mask=ok)
        else:
            v = acc * (128.0 * gl.load(gs_ptr))
            if HAS_BIAS:
                bl = pid_n * 128 + CID * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_l))
                v += gl.load(bias_ptr + bl, mask=bl < N, other=0.0).to(gl.float32)[:, None]
            v = gl.convert_layout(v.to(DT), st_l)
            gl.store(y_ptr + toks.to(gl.int64) * s_yt + rows, v, mask=ok)

    @gluon.jit
    def _producer(x_desc, x_s, full, empty, KI, per, R0, S, BT: gl.constexpr, STAGES: gl.constexpr):
        """x' tiles [BT, 64] of this program's tokens and K range into the ring by TMA, in step order."""
        _, _, it0, n_it = _piece(KI, per, R0, S)
        t0 = gl.program_id(0) * BT
        for j in range(4 * n_it):
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
            mbarrier.expect(full.index(s), BT * 128)
            tma.async_copy_global_to_shared(x_desc, [t0, it0 * 256 + j * 64], full.index(s), x_s.index(s))

    @gluon.jit
    def _prefill_wgmma_kernel(x_desc, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr, T, N, KI, per, R0, S, s_yt,
                              BT: gl.constexpr, STAGES: gl.constexpr, PARTIAL: gl.constexpr, HAS_BIAS: gl.constexpr,
                              L2PF: gl.constexpr, CONS_REGS: gl.constexpr, PROD_REGS: gl.constexpr,
                              num_warps: gl.constexpr):
        """Grid (token tiles, R0 row tiles of 128 + S pieces of each later one, 1; _piece): token tiles vary
        fastest, so the programs reading one row tile's weights run together and share them in L2. PARTIAL: the
        pieces' fp32 sums to part [S, T, N - 128 R0]."""
        x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BT, 64], x_desc.layout)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)

        gl.warp_specialize([
            (_consumer, (w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr, x_s, full, empty, T, N, KI, per, R0, S, s_yt,
                         0, BT, STAGES, PARTIAL, HAS_BIAS, L2PF)),
            (_consumer, (w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr, x_s, full, empty, T, N, KI, per, R0, S, s_yt,
                         1, BT, STAGES, PARTIAL, HAS_BIAS, L2PF)),
            (_producer, (x_desc, x_s, full, empty, KI, per, R0, S, BT, STAGES)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


@dataclass(frozen=True)
class WgmmaPrefillConfig(KernelConfig):
    """BT tokens a program (64, 128 or 256; 0: planned), STAGES ring slots of [BT, 64], split: every tile in that
    many pieces of K (0: planned), the consumers' and producer's registers (setmaxnreg), l2pf: the weights of the
    iteration that many ahead prefetched to L2 (-1: 2 for BT <= 128, where a step is short, else none; notes linear
    round 20), tail: split the last partial wave's row tiles along K (wgmma_prefill_plan); NSM: the SM count it
    plans for (tests; None: the GPU's)."""
    BT: int = 0
    STAGES: int = 4
    split: int = 0
    CONS_REGS: int = 224
    PROD_REGS: int = 56
    l2pf: int = -1
    tail: bool = True
    NSM: Optional[int] = None


WGMMA_MAX_T = 2048  # at 4096 tokens dequantize + cuBLAS ties the kernel (1.09-1.14x cuBLAS alone; round 22)


def wgmma_prefill_usable(x: torch.Tensor) -> bool:
    """sm_90 with Gluon, 17-2048 tokens of fp16 / bf16 (the weights: the tiled layout, N % 16 == K % 256 == 0)."""
    if not HAVE_GLUON or interpreting() or x.device.type != "cuda" or capability(x.device) != (9, 0):
        return False
    return MMA_MAX_T < x.shape[0] <= WGMMA_MAX_T and x.dtype in (torch.bfloat16, torch.float16)


def wgmma_prefill_plan(T: int, N: int, K: int, device, cfg=None):
    """(BT, whole, split, iterations a piece): the first `whole` row tiles of 128 run all of K, the others in `split`
    pieces of K (fp32 partials, then the split-K reduce). BT 64 up to 64 tokens, 256 from 256 tokens where that still
    gives half the SMs a tile and pads at most 1 / 0.9 times the rows BT 128 pads to (a row costs ~0.9x at 256),
    else 128 (the H100 sweeps, notes/nvfp4_gemv.md, linear rounds 20 and 23). Split: every tile
    where the tiles do not fill the SMs; else (tail) the row tiles of the last partial wave where that leaves them
    at least 2 pieces each: 28672 x 4096 at 512 tokens has 448 tiles of 256 tokens, 3 waves + 52 tiles (round 22)."""
    c = WgmmaPrefillConfig.of(cfg)
    sms, rows, KI = planned_sms(c.NSM, device), cdiv(N, 128), K // TILE_K
    big = T >= 256 and cdiv(T, 256) * rows >= sms // 2 and 9 * cdiv(T, 256) * 256 <= 10 * cdiv(T, 128) * 128
    bt = c.BT or (64 if T <= 64 else 256 if big else 128)
    if bt not in (64, 128, 256):
        raise ValueError(f"BT (={bt}) must be 64, 128 or 256")
    tt = cdiv(T, bt)
    tiles = tt * rows
    if c.split or tiles < sms:
        whole, split = 0, c.split or max(1, min(sms // tiles, KI // 2))
    else:
        left = cdiv(tiles % sms, tt)  # row tiles of the last wave
        whole, split = rows - left, min(sms // (left * tt), KI // 2) if c.tail and left else 1
    if split == 1:
        return bt, rows, 1, KI
    per = cdiv(KI, split)
    return bt, whole, cdiv(KI, per), per


def _setup(T: int, N: int, K: int, device, has_bias: bool, cfg=None):
    """(grid, (whole, split, iterations a piece), the kernel's constexprs and options) of one call shape."""
    c = WgmmaPrefillConfig.of(cfg)
    bt, whole, split, per = wgmma_prefill_plan(T, N, K, device, c)
    opts = dict(BT=bt, STAGES=c.STAGES, PARTIAL=split > 1, HAS_BIAS=has_bias,
                L2PF=c.l2pf if c.l2pf >= 0 else 2 if bt <= 128 else 0, CONS_REGS=c.CONS_REGS, PROD_REGS=c.PROD_REGS,
                num_warps=4)
    return (cdiv(T, bt), whole + (cdiv(N, 128) - whole) * split, 1), (whole, split, per), opts


class _Desc:
    """What the kept launcher reads of a TMA descriptor argument (Triton's TensorDescriptor validates each time)."""
    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base: torch.Tensor):
        self.base, self.shape, self.strides, self.padding = base, list(base.shape), list(base.stride()), "zero"


def _x_desc(xp: torch.Tensor, bt: int, kept: bool):
    """x' [tiles x BT, K] as the kernel's TMA descriptor: boxes [BT, 64], 128-byte swizzle (one box row)."""
    if kept:
        return _Desc(xp)
    sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    return TensorDescriptor(xp, list(xp.shape), list(xp.stride()), [bt, 64], sl)


def wgmma_prefill_launch(x, packed, scales, gs, bias, y, cfg=None):
    """x [T, K] (unit last stride), packed / scales in the tiled layout, gs fp32 [1], bias fp32 [N] or None -> y
    [T, N] (contiguous)."""
    T, K = x.shape
    N = packed.shape[0]
    grid, (whole, split, per), opts = _setup(T, N, K, x.device, bias is not None, cfg)
    xp = permute_x(x if _pairs_ok(x) else x.clone(memory_format=torch.contiguous_format), grid[0] * opts["BT"])
    part = torch.empty(split, T, N - 128 * whole, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_prefill_wgmma_kernel, grid, _x_desc(xp, opts["BT"], False), _u8(packed).view(torch.int64),
           _u8(scales).view(torch.int64), gs, bias if bias is not None else gs, y, part, T, N, K // TILE_K, per, whole,
           split, y.stride(0), **opts)
    if split > 1:
        _reduce_linear(part, y[:, 128 * whole:], gs, bias[128 * whole:] if bias is not None else None)
    return y


class WgmmaPrefillPlan:
    """wgmma_prefill_launch for one call shape (x's shape, strides, dtype and alignment; N; bias or not), worked out
    once for the op's cached plans (see _launch): a call allocates x', y (and the split parts) and hands their
    pointers to the kept kernels (an eager prefill call: 104-136 us of host time before, notes linear round 21)."""
    __slots__ = ("T", "N", "K", "TP", "BT", "dtype", "copy", "split", "col", "ints", "perm", "main", "reduce",
                 "descs")

    def __init__(self, x, N: int, has_bias: bool):
        T, K = x.shape
        grid, (whole, split, per), opts = _setup(T, N, K, x.device, has_bias)
        self.T, self.N, self.K, self.dtype, self.split, self.col = T, N, K, x.dtype, split, 128 * whole
        self.BT, self.TP = opts["BT"], grid[0] * opts["BT"]  # x' rows: whole token tiles
        self.copy = not _pairs_ok(x)
        self.ints = (T, N, K // TILE_K, per, whole, split, N)  # y is contiguous
        self.perm = Launch(_permute_x_kernel, _perm_grid(self.TP, K), **_PERM)
        self.main = Launch(_prefill_wgmma_kernel, grid, **opts)
        self.reduce = reduce_plan(split, T, N - self.col, has_bias)
        self.descs = {}  # x' address -> its descriptor's launcher arguments (_x_args)

    def _x_args(self, xp):
        """(the main launch, its x' descriptor arguments). A kept launch takes the descriptor encoded once per x'
        address (x' comes from the caching allocator: a few addresses), as Triton's launcher would encode it on
        every call (~7 us of an eager call; notes linear round 23); the descriptor depends only on the address."""
        direct = self.main.direct()
        if direct:
            e = self.descs.get(xp.data_ptr())
            if e is None:
                e = self.main.encode(0, _Desc(xp))
                if e is not None:
                    if len(self.descs) >= 8:
                        self.descs.clear()
                    self.descs[xp.data_ptr()] = e
            if e is not None:
                return self.main.direct_encoded, e
        return self.main, (_x_desc(xp, self.BT, direct),)

    def __call__(self, x, packed, scales, gs, bias):
        """x [T, K], packed / scales (tiled) as the plan's key had them (a kept kernel reads addresses only)."""
        T, N, K = self.T, self.N, self.K
        if self.copy:
            x = x.clone(memory_format=torch.contiguous_format)
        xp = torch.empty(self.TP, K, dtype=self.dtype, device=x.device)
        y = torch.empty(T, N, dtype=self.dtype, device=x.device)
        b = bias if bias is not None else gs
        if self.perm.direct():
            self.perm(x, xp, T, self.TP, K, x.stride(0))
        else:  # Triton's path (first call, launch hooks) types the pointers from the tensors
            self.perm(x.view(torch.int32), xp.view(torch.int32), T, self.TP, K, x.stride(0))
        go, xd = self._x_args(xp)
        if not self.main.direct():
            packed, scales = _u8(packed).view(torch.int64), _u8(scales).view(torch.int64)
        if self.reduce is None:
            go(*xd, packed, scales, gs, b, y, y, *self.ints)
            return y
        c = self.col
        part = torch.empty(self.split, T, N - c, dtype=torch.float32, device=x.device)
        go(*xd, packed, scales, gs, b, y, part, *self.ints)
        self.reduce(part, y[:, c:], gs, b[c:] if bias is not None else gs, 1.0, T, N - c, N, 1)
        return y
