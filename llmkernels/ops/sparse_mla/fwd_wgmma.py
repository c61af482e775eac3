"""Sparse MLA forward for Hopper in Gluon (warp-specialised), used on sm_90; fwd.py is the portable path.

One program per (query row, 64 heads), "seesaw" schedule. kv tiles of 64 rows come in pairs (tile a in ring slot 0,
tile b in slot 1), gathered by a 4-warp cp.async producer. Two consumer warpgroups:
  S, P   : consumer 0 computes S = q k^T and P for tile a, consumer 1 for tile b (full d_qk, m64n64 wgmma with q
           in shared memory);
  O += PV: consumer c owns output columns [256 c, 256 c + 256) and multiplies both tiles' P into them: its own P
           from registers, the other's through shared memory (written over the tile's rope columns, which only S
           reads). A [64, 512] fp32 O would not fit one warpgroup's registers; half of it does.
The running max is shared: consumer 0 publishes m0 = max(m, rowmax a) and P a at m0, consumer 1 m1 = max(m0,
rowmax b) and P b at m1; each consumer brings its O half to m0 before adding P a V a and to m1 before adding P b V b.
Each slot is gathered in two halves so it can be refilled as soon as its readers are done: the early half (the 256
columns consumer s multiplies by its own P) and the late half (the other 256 columns and the rope). Measured history:
benchmarks/notes/sparse_mla_fwd.md.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..._gluon import (HAVE_GLUON, async_copy, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                       warpgroup_mma_wait)
from ..._config import KernelConfig
from ..._launch import Launch, keyed
from ..._runtime import capturing, cdiv, next_pow2, planned_sms
from ..combine.kernel import split_scratch
from .common import LN2_C, LOG2E_C, nan_max, row_args, row_finish, row_flags, row_ptrs

if HAVE_GLUON:
    from .wgmma_common import cvt2, mma_layout, q_and_slots, row_limits, ws_check, ws_idx, ws_valid

    @gluon.jit
    def _xchg(buf, bars, k: gl.constexpr, x):
        """Publish x (one value per head) to the other consumer: store, then one arrival on bars[k]."""
        buf.store(x)
        gl.thread_barrier()
        mbarrier.arrive(bars.index(k), count=1)

    @gluon.jit
    def _see_s(q3_s, qhi_s, klo_s, khi_s, full, z, ph, sa, CID: gl.constexpr, LATE: gl.constexpr, D_V: gl.constexpr,
               D_T: gl.constexpr, pred=True):
        """Issue one half of S = q k^T for this consumer's tile (slot CID) once that half has landed: the early half
        (this consumer's own 256 columns; sa is the zero accumulator) or the late half and the rope. pred False skips
        the barrier waits (consumer 0's dummy S of a row with nothing to scan)."""
        DH: gl.constexpr = D_V // 2
        c: gl.constexpr = ((1 - CID) if LATE else CID) * DH
        qz_s = q3_s.index(z)
        sa_s = klo_s.index(CID + z)
        mbarrier.wait(full.index(CID + 2 * LATE), ph, pred=pred)
        fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
        sa = warpgroup_mma(qz_s.slice(c, DH, dim=1), sa_s.slice(c, DH, dim=1).permute((1, 0)), sa,
                           use_acc=LATE, is_async=True)
        if LATE and D_T > 0:
            sa = warpgroup_mma(qhi_s, khi_s.index(CID).permute((1, 0)), sa, is_async=True)
        return sa

    @gluon.jit
    def _c0_pair(sa, t, acc, m_i, l_i, i, z, ph, klo_s, pbuf, xm, bars, empty, s_kv, limit, qk_scale,
                 BLOCK_N: gl.constexpr, D_V: gl.constexpr, CAUSAL: gl.constexpr):
        """Consumer 0's part of pair i from S a (in flight) to P b V b (issued, returned in flight): see
        _see_consumer."""
        DH: gl.constexpr = D_V // 2
        c0: gl.constexpr = 0
        s_l: gl.constexpr = mma_layout(BLOCK_N)  # S, P [64 heads, BLOCK_N]
        o_l: gl.constexpr = mma_layout(DH)  # this consumer's O half [64 heads, DH]
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, s_l)
        orow_l: gl.constexpr = gl.SliceLayout(1, o_l)
        sa_s = klo_s.index(z)
        valid = ws_check(t, s_kv, limit, CAUSAL)  # before the wait: off the softmax's path (t came long ago)
        sa = warpgroup_mma_wait(num_outstanding=0, deps=(sa,))
        sc = gl.where(valid[None, :], sa * qk_scale, float("-inf"))
        m0 = gl.maximum(m_i, gl.max(sc, axis=1))
        m_safe = gl.where(m0 == float("-inf"), 0.0, m0)  # nothing valid yet: avoid inf - inf
        p = gl.exp2(sc - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, orow_l)[:, None]
        p16 = cvt2(p, klo_s.dtype)
        pb = gl.convert_layout(p16, p_l)
        acc = warpgroup_mma(pb, sa_s.slice(c0, DH, dim=1), acc, is_async=True)  # V = kv[:, :D_V]
        # P of tile a at m0 for consumer 1, which scales its O to m0 before and to m1 after adding it
        xm.index(0).store(m0)  # published with P a: one barrier for both
        pbuf.index(0).store(p16)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(3), count=1)
        mbarrier.wait(bars.index(2), ph)
        m1 = xm.index(1).load(row_l)
        # m1 >= m0; with nothing valid so far, P and O are 0 and any finite factor does
        beta = gl.where(m0 == float("-inf"), 1.0, gl.exp2(m0 - m1))
        acc, pb = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pb))
        gl.thread_barrier()  # done with slot 0: its early half and (with consumer 1) its late half
        mbarrier.arrive(empty.index(0), count=1)
        mbarrier.arrive(empty.index(2), count=1)
        acc = acc * gl.convert_layout(beta, orow_l)[:, None]
        l_i = l_i * beta
        mbarrier.wait(bars.index(4), ph)
        acc = warpgroup_mma(pbuf.index(1 + z), klo_s.index(1 + z).slice(c0, DH, dim=1), acc, is_async=True)
        return acc, m1, l_i

    @gluon.jit
    def _split_out(part_ptr, l_i, m_i, acc, xl, bars, CID: gl.constexpr, DH: gl.constexpr, row_l: gl.constexpr,
                   o_l: gl.constexpr):
        """SPLIT: this program's share of its row, for _tail_merge: O / l at its own max in fp32 [64, 2 DH], then
        log2(l) + m and m (log2-scaled logits; -inf where nothing was valid), 64 of each. No sink here."""
        _xchg(xl.index(CID), bars, 5, l_i)
        mbarrier.wait(bars.index(5), 0)
        l_i = l_i + xl.index(1 - CID).load(row_l)
        empty_row = (m_i == float("-inf")) & (l_i == 0)  # not all-NaN logits (max -inf, l NaN): those stay NaN
        inv = gl.where(empty_row, 0.0, 1.0 / gl.where(empty_row, 1.0, l_i))
        o = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_l))[:, None]
        pid = gl.program_id(0).to(gl.int64)
        h = gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
        d = CID * DH + gl.arange(0, DH, layout=gl.SliceLayout(0, o_l))
        gl.store(part_ptr + pid * (64 * 2 * DH + 128) + h[:, None] * (2 * DH) + d[None, :], o)
        if CID == 0:
            hr = gl.arange(0, 64, layout=row_l)
            lse2 = gl.where(empty_row, float("-inf"), m_i + gl.log2(gl.where(empty_row, 1.0, l_i)))
            gl.store(part_ptr + pid * (64 * 2 * DH + 128) + 64 * 2 * DH + hr, lse2)
            gl.store(part_ptr + pid * (64 * 2 * DH + 128) + 64 * 2 * DH + 64 + hr, m_i + l_i * 0.0)  # NaN if l is

    @gluon.jit
    def _see_consumer(q_ptr, idx_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, klo_s, khi_s, pbuf, qlo_s, qhi_s, xm, xl,
                      bars, full, empty, row, hb, h_q, n_len, s_kv, limit, qk_scale, s_qm, s_qh, s_im, s_om, s_oh,
                      s_lm, zero, t0, part_ptr, CID: gl.constexpr, BLOCK_N: gl.constexpr,
                      D_V: gl.constexpr, D_T: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINK: gl.constexpr,
                      SINK_IN_LSE: gl.constexpr, SPLIT: gl.constexpr):
        """Consumer CID of the seesaw (module docstring). Ring barriers [early 0, early 1, late 0, late 1].
        Per pair, consumer 0: S a (then lets consumer 1 issue S b, which queues behind it, so this softmax overlaps
        S b), P a at m0 to consumer 1, P a V a (frees slot 0's early half), O to m1, then P b V b
        (frees slot 1's late half). Consumer 1: O to m0, P a V a under S b (frees slot 0's late half without
        waiting for its own softmax), S b's softmax at m1, O to m1, P b V b (frees slot 1). P is rounded once.
        Consumer 0 issues the next pair's S a before waiting for its P b V b, so the tensor cores go from one to the
        other without this warpgroup's loop overhead in between (consumers alone: +12 %; the earlier order, the A/B
        switch EARLY_S=0, is at d0673ea: benchmarks/notes/sparse_mla_fwd.md, version 11)."""
        DH: gl.constexpr = D_V // 2
        s_l: gl.constexpr = mma_layout(BLOCK_N)  # S, P [64 heads, BLOCK_N]
        o_l: gl.constexpr = mma_layout(DH)  # this consumer's O half [64 heads, DH]
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, s_l)
        orow_l: gl.constexpr = gl.SliceLayout(1, o_l)
        col_l: gl.constexpr = gl.SliceLayout(0, s_l)
        c0: gl.constexpr = CID * DH

        # q into shared memory, half of its columns by each consumer; both read all of it
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_h = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        q_rows = q_ptr + row * s_qm + offs_h[:, None].to(gl.int64) * s_qh
        hmask = offs_h[:, None] < h_q
        async_copy.async_copy_global_to_shared(
            qlo_s.slice(c0, DH, dim=1), q_rows + c0 + gl.arange(0, DH, layout=gl.SliceLayout(0, ld_l))[None, :],
            mask=hmask)
        if CID == 1 and D_T > 0:
            async_copy.async_copy_global_to_shared(
                qhi_s, q_rows + D_V + gl.arange(0, D_T, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask)
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(0), count=1)
        mbarrier.wait(bars.index(0), 0)

        q3_s = qlo_s._reinterpret(qlo_s.dtype, [1, 64, D_V], qlo_s.layout)
        m_i = gl.full([64], float("-inf"), gl.float32, row_l)  # running max of the log2-scaled logits
        l_i = gl.zeros([64], gl.float32, row_l)  # this consumer's tiles' share of the denominator, at m_i
        acc = gl.zeros([64, DH], gl.float32, o_l)
        zero_s = gl.zeros([64, BLOCK_N], gl.float32, s_l)
        off = 0  # SPLIT: this program scans the row's entries [t0, n_len) only
        if SPLIT:
            off = t0
        n_pairs = gl.cdiv(n_len - off, 2 * BLOCK_N)
        if CID == 0:
            # FlashMLA's order: the next pair's S a is issued right behind P b V b, so the tensor cores never wait
            # for this warpgroup's loop overhead; slot 1's late half is released between S a's two halves. The
            # last pair is peeled (an in-flight S cannot be carried out of the loop) and n_len == 0 issues a dummy
            # S on whatever slot 0 holds (its result is never used), keeping the accumulator's type loop-invariant.
            has = n_pairs > 0
            t = ws_idx(idx_ptr, row, off, n_len, s_im, BLOCK_N, col_l)
            sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, zero, 0, zero_s, 0, False, D_V, D_T, has)
            sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, zero, 0, sa, 0, True, D_V, D_T, has)
            gl.thread_barrier()
            mbarrier.arrive(bars.index(6), count=1)
            for i in range(n_pairs - 1):
                ph = i & 1
                z = zero * i
                acc, m_i, l_i = _c0_pair(sa, t, acc, m_i, l_i, i, z, ph, klo_s, pbuf, xm, bars, empty, s_kv, limit,
                                         qk_scale, BLOCK_N, D_V, CAUSAL)
                zn = zero * (i + 1)
                t = ws_idx(idx_ptr, row, off + (2 * i + 2) * BLOCK_N, n_len, s_im, BLOCK_N, col_l)
                sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, zn, ph ^ 1, zero_s, 0, False, D_V, D_T, True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # P b V b done; S a still running
                gl.thread_barrier()
                mbarrier.arrive(empty.index(3), count=1)
                sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, zn, ph ^ 1, sa, 0, True, D_V, D_T, True)
                gl.thread_barrier()
                mbarrier.arrive(bars.index(6), count=1)
            if has:
                i = n_pairs - 1
                acc, m_i, l_i = _c0_pair(sa, t, acc, m_i, l_i, i, zero * i, i & 1, klo_s, pbuf, xm, bars, empty, s_kv,
                                         limit, qk_scale, BLOCK_N, D_V, CAUSAL)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                gl.thread_barrier()
                mbarrier.arrive(empty.index(3), count=1)
            warpgroup_mma_wait(num_outstanding=0, deps=(sa,))  # the dummy S of an empty row
        else:  # consumer 1
            for i in range(n_pairs):
                ph = i & 1
                # zero * i (zero is a runtime 0): shared-memory addresses the compiler cannot hoist, else it keeps the
                # 2 x 36 wgmma descriptors of q and the tile live across the loop and spills them
                z = zero * i
                sa_s = klo_s.index(CID + z)
                t = ws_idx(idx_ptr, row, off + (2 * i + CID) * BLOCK_N, n_len, s_im, BLOCK_N, col_l)  # tested later
                # S b queues behind S a on the tensor cores: consumer 0's softmax overlaps S b
                mbarrier.wait(bars.index(6), ph)
                # the early half of the slot (this consumer's own 256 columns) lands first
                sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, z, ph, zero_s, CID, False, D_V, D_T, True)
                sa = _see_s(q3_s, qhi_s, klo_s, khi_s, full, z, ph, sa, CID, True, D_V, D_T, True)
                mbarrier.wait(bars.index(3), ph)  # P a and m0
                m0 = xm.index(0).load(row_l)
                m0_safe = gl.where(m0 == float("-inf"), 0.0, m0)
                alpha = gl.exp2(m_i - m0_safe)
                acc = acc * gl.convert_layout(alpha, orow_l)[:, None]
                l_i = l_i * alpha
                # P a V a (at m0) under S b: slot 0 frees without waiting for this consumer's softmax
                acc = warpgroup_mma(pbuf.index(z), klo_s.index(z).slice(c0, DH, dim=1), acc, is_async=True)
                valid = ws_check(t, s_kv, limit, CAUSAL)
                sa = warpgroup_mma_wait(num_outstanding=1, deps=(sa,))
                sc = gl.where(valid[None, :], sa * qk_scale, float("-inf"))
                m1 = gl.maximum(m0, gl.max(sc, axis=1))
                _xchg(xm.index(1), bars, 2, m1)
                m_safe = gl.where(m1 == float("-inf"), 0.0, m1)
                p = gl.exp2(sc - m_safe[:, None])
                p16 = cvt2(p, klo_s.dtype)
                pbuf.index(1).store(p16)  # P of tile b, for consumer 0
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(bars.index(4), count=1)
                gamma = gl.where(m0 == float("-inf"), 1.0, gl.exp2(m0 - m1))
                l_i = l_i * gamma + gl.sum(p, axis=1)
                pb = gl.convert_layout(p16, p_l)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                gl.thread_barrier()
                mbarrier.arrive(empty.index(2), count=1)
                acc = acc * gl.convert_layout(gamma, orow_l)[:, None]
                acc = warpgroup_mma(pb, sa_s.slice(c0, DH, dim=1), acc, is_async=True)
                acc, pb = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pb))
                gl.thread_barrier()
                mbarrier.arrive(empty.index(1), count=1)
                mbarrier.arrive(empty.index(3), count=1)
                m_i = m1

        if SPLIT:
            _split_out(part_ptr, l_i, m_i, acc, xl, bars, CID, DH, row_l, o_l)
            return
        offs_hm = hb * 64 + gl.arange(0, 64, layout=row_l)
        hm = offs_hm < h_q
        if HAS_SINK:  # loaded before the exchange, whose wait covers the load's latency
            sink2 = gl.load(sink_ptr + offs_hm, mask=hm, other=0.0) * LOG2E_C
        _xchg(xl.index(CID), bars, 5, l_i)  # the denominator is the sum of both consumers' shares
        mbarrier.wait(bars.index(5), 0)
        l_i = l_i + xl.index(1 - CID).load(row_l)
        empty_row = (m_i == float("-inf")) & (l_i == 0)  # nothing valid; all-NaN logits (max -inf, l NaN) stay NaN
        l_safe = gl.where(empty_row, 1.0, l_i)
        lse2 = m_i + gl.log2(l_safe)  # log2-sum-exp2 of the logits alone
        denom = l_safe
        if HAS_SINK:
            d = sink2 - lse2
            sp2 = gl.maximum(d, 0.0) + gl.log2(1.0 + gl.exp2(-gl.abs(d)))  # log2(1 + 2^d) without overflow
            denom = l_safe * gl.exp2(sp2)
            if SINK_IN_LSE:
                lse2 = lse2 + sp2
        # one reciprocal per row and one multiply per value (an empty row's factor is 0: O = 0); dividing each value
        # cost ~2000 instructions a thread (div.full.f32 expands to ~8), ~1300 clocks of the epilogue
        o = acc * gl.convert_layout(gl.where(empty_row, 0.0, 1.0 / denom), orow_l)[:, None]
        if CID == 0:
            gl.store(maxl_ptr + row * s_lm + offs_hm, (m_i + l_i * 0.0) * LN2_C, mask=hm)  # common.nan_max
            gl.store(lse_ptr + row * s_lm + offs_hm, gl.where(empty_row, float("inf"), lse2 * LN2_C),
                     mask=hm)
        # Both consumers are past their last S (the l exchange above), so q's buffer is free: this consumer's O
        # half goes through its columns and out as 512-byte rows. Stored straight from the wgmma layout, it was
        # 4-byte pieces of 8 rows an instruction, and the epilogue took ~9000 clocks, ~8 % of a program.
        o_s = qlo_s.slice(c0, DH, dim=1)
        o_s.store(o.to(qlo_s.dtype))
        gl.thread_barrier()
        st_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        offs_hs = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))
        offs_ds = c0 + gl.arange(0, DH, layout=gl.SliceLayout(0, st_l))
        gl.store(out_ptr + row * s_om + offs_hs[:, None].to(gl.int64) * s_oh + offs_ds[None, :],
                 o_s.load(st_l).to(out_ptr.dtype.element_ty), mask=(offs_hs < h_q)[:, None])

    @gluon.jit
    def _see_copy(klo_s, khi_s, full, empty, base, valid, ph, wait, S: gl.constexpr, LATE: gl.constexpr,
                  D_V: gl.constexpr, D_T: gl.constexpr, layout: gl.constexpr):
        """Gather one half of a tile into slot S: early = columns [256 S, 256 S + 256), late = the others + rope."""
        DH: gl.constexpr = D_V // 2
        k: gl.constexpr = S + 2 * LATE
        c: gl.constexpr = ((1 - S) if LATE else S) * DH
        mbarrier.wait(empty.index(k), ph, pred=wait)
        async_copy.async_copy_global_to_shared(klo_s.index(S).slice(c, DH, dim=1),
                                               base + c + gl.arange(0, DH, layout=layout)[None, :], mask=valid)
        if LATE and D_T > 0:
            async_copy.async_copy_global_to_shared(khi_s.index(S),
                                                   base + D_V + gl.arange(0, D_T, layout=layout)[None, :],
                                                   mask=valid)
        async_copy.mbarrier_arrive(full.index(k), increment_count=False)

    @gluon.jit
    def _see_producer(kv_ptr, idx_ptr, klo_s, khi_s, full, empty, row, n_len, s_kv, limit, s_kvn, s_im, t0,
                      BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, CAUSAL: gl.constexpr,
                      SPLIT: gl.constexpr):
        """4 warps: per pair of tiles (a -> slot 0, b -> slot 1) the four halves in the order the consumers free
        them: slot 0 (early, late), then slot 1. Tiles past n_len are all-invalid rows (zero-filled)."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rl: gl.constexpr = gl.SliceLayout(1, g_l)
        cl: gl.constexpr = gl.SliceLayout(0, g_l)
        off = 0
        if SPLIT:
            off = t0
        n_pairs = gl.cdiv(n_len - off, 2 * BLOCK_N)
        va, ia = ws_valid(idx_ptr, row, off, n_len, s_im, s_kv, limit, BLOCK_N, CAUSAL, rl)
        vb, ib = ws_valid(idx_ptr, row, off + BLOCK_N, n_len, s_im, s_kv, limit, BLOCK_N, CAUSAL, rl)
        for i in range(n_pairs):
            ph = (i & 1) ^ 1
            base_a = kv_ptr + gl.where(va, ia, 0).to(gl.int64)[:, None] * s_kvn
            base_b = kv_ptr + gl.where(vb, ib, 0).to(gl.int64)[:, None] * s_kvn
            # the next pair's indices now, tested only after copies were issued (a load tested at once stalls the
            # producer for its L2 round trip), so its addresses are ready when its slots free
            ia = ws_idx(idx_ptr, row, off + (2 * i + 2) * BLOCK_N, n_len, s_im, BLOCK_N, rl)
            ib_n = ws_idx(idx_ptr, row, off + (2 * i + 3) * BLOCK_N, n_len, s_im, BLOCK_N, rl)
            _see_copy(klo_s, khi_s, full, empty, base_a, va[:, None], ph, i > 0, 0, False, D_V, D_T, cl)
            _see_copy(klo_s, khi_s, full, empty, base_a, va[:, None], ph, i > 0, 0, True, D_V, D_T, cl)
            _see_copy(klo_s, khi_s, full, empty, base_b, vb[:, None], ph, i > 0, 1, False, D_V, D_T, cl)
            va = ws_check(ia, s_kv, limit, CAUSAL)
            _see_copy(klo_s, khi_s, full, empty, base_b, vb[:, None], ph, i > 0, 1, True, D_V, D_T, cl)
            vb = ws_check(ib_n, s_kv, limit, CAUSAL)
            ib = ib_n

    @gluon.jit(do_not_specialize=["zero"])
    def _fwd_see_kernel(q_ptr, kv_ptr, idx_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, tlen_ptr, qs_ptr,
                        s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride,
                        s_qm, s_qh, s_kvn, s_im, s_om, s_oh, s_lm, zero, item0, n_piece, pp, part_ptr,
                        BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr,
                        HAS_SINK: gl.constexpr, HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr,
                        QS_TENSOR: gl.constexpr, SINK_IN_LSE: gl.constexpr, CONS_REGS: gl.constexpr,
                        PROD_REGS: gl.constexpr, num_warps: gl.constexpr, SPLIT: gl.constexpr = 0):
        """One program per (query row, 64 heads); SPLIT: n_piece programs per item of items [item0, ...), piece p
        scanning the row's entries [p pp 128, (p + 1) pp 128) and leaving a partial result for _tail_merge."""
        pid = gl.program_id(0)
        it = pid
        if SPLIT:
            it = item0 + pid // n_piece
        row = (it // n_hb).to(gl.int64)
        hb = it % n_hb
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        t0 = 0
        if SPLIT:
            t0 = (pid % n_piece) * pp * (2 * BLOCK_N)
            n_len = gl.maximum(gl.minimum(n_len, t0 + pp * (2 * BLOCK_N)), t0)
        klo_s, khi_s, qlo_s, qhi_s = q_and_slots(dtype, BLOCK_N, D_V, D_T)
        full = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        for k in gl.static_range(4):
            mbarrier.init(full.index(k), count=128)  # one arrival per producer thread
            mbarrier.init(empty.index(k), count=1 if k < 2 else 2)  # early halves: one reader; late: both
        v_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        xm = gl.allocate_shared_memory(gl.float32, [2, 64], v_l)
        xl = gl.allocate_shared_memory(gl.float32, [2, 64], v_l)
        # 0: q loaded (both consumers), 1: unused (m0 goes with P a), 2: m1 published, 3: P and m0 of tile a,
        # 4: P of tile b, 5: l, 6: S of tile a issued (consumer 1 then issues S b)
        bars = gl.allocate_shared_memory(gl.int64, [7, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(7):
            mbarrier.init(bars.index(i), count=2 if i == 0 or i == 5 else 1)
        gl.warp_specialize([
            (_see_consumer, (q_ptr, idx_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, klo_s, khi_s, khi_s, qlo_s, qhi_s,
                             xm, xl, bars, full, empty, row, hb, h_q, n_len, s_kv, limit, qk_scale, s_qm, s_qh, s_im,
                             s_om, s_oh, s_lm, zero, t0, part_ptr, 0, BLOCK_N, D_V, D_T, CAUSAL, HAS_SINK,
                             SINK_IN_LSE, SPLIT)),
            (_see_consumer, (q_ptr, idx_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, klo_s, khi_s, khi_s, qlo_s, qhi_s,
                             xm, xl, bars, full, empty, row, hb, h_q, n_len, s_kv, limit, qk_scale, s_qm, s_qh, s_im,
                             s_om, s_oh, s_lm, zero, t0, part_ptr, 1, BLOCK_N, D_V, D_T, CAUSAL, HAS_SINK,
                             SINK_IN_LSE, SPLIT)),
            (_see_producer, (kv_ptr, idx_ptr, klo_s, khi_s, full, empty, row, n_len, s_kv, limit, s_kvn, s_im,
                             t0, BLOCK_N, D_V, D_T, CAUSAL, SPLIT)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


@triton.jit
def _tail_merge(part_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, item0, n_piece, n_hb, h_q, s_om, s_oh, s_lm,
                HAS_SINK: tl.constexpr, SINK_IN_LSE: tl.constexpr, BLOCK_P: tl.constexpr, D_V: tl.constexpr):
    """One (item, head) of the split items: merges its pieces' (O / l, log2 l + m, m) into out, max_logits and lse
    exactly as the unsplit epilogue finishes them (sink, empty row: out 0, lse +inf)."""
    j = tl.program_id(0)
    h = tl.program_id(1)
    it = item0 + j
    row = (it // n_hb).to(tl.int64)
    head = (it % n_hb) * 64 + h
    if head < h_q:
        p = tl.arange(0, BLOCK_P)
        pm = p < n_piece
        base = (j * n_piece + p).to(tl.int64) * (64 * D_V + 128)
        l2 = tl.load(part_ptr + base + 64 * D_V + h, mask=pm, other=float("-inf"))
        m = tl.load(part_ptr + base + 64 * D_V + 64 + h, mask=pm, other=float("-inf"))
        top = tl.max(l2, axis=0)  # -inf: no piece had anything valid
        w = tl.exp2(l2 - tl.where(top == float("-inf"), 0.0, top))  # 0 for pieces with nothing valid
        d = tl.arange(0, D_V)
        o = tl.load(part_ptr + base[:, None] + h * D_V + d[None, :], mask=(pm & (w > 0))[:, None], other=0.0)
        o = tl.sum(o * w[:, None], axis=0)
        empty, lse2, denom = row_finish(top, tl.sum(w, axis=0), sink_ptr, head, True, HAS_SINK, SINK_IN_LSE)
        tl.store(out_ptr + row * s_om + head * s_oh + d, tl.where(empty, 0.0, o / denom).to(out_ptr.dtype.element_ty))
        tl.store(maxl_ptr + row * s_lm + head, nan_max(tl.max(m, axis=0), tl.sum(w, axis=0)) * LN2_C)
        tl.store(lse_ptr + row * s_lm + head, tl.where(empty, float("inf"), lse2 * LN2_C))


# Tail split cost model, fitted on the H100 (notes/host_path.md, version 5): a 64-row program spends ~3.3 us a pair of
# 64-entry tiles; the merge costs ~3 us of launch plus writing and reading the pieces' fp32 parts (~3 MB/us).
_PAIR_US, _MERGE_US, _PART_BYTES_PER_US = 3.3, 3.0, 3.0e6


def _piece_floats(d_v: int) -> int:
    """fp32 values a piece leaves for _tail_merge: O / l [64, d_v], log2 l + m [64], m [64]."""
    return 64 * d_v + 128


def tail_split(n_items: int, n_sm: int, n_pairs: int, d_v: int = 512) -> tuple:
    """(items run whole, pieces per remaining item, pairs per piece). The items of the last, partial wave (all of them
    when there are fewer than the SMs) are split over their topk so that they fill the idle SMs: a whole program
    per item there would leave the GPU waiting on a few SMs for a full program (~3 % at s_q 4096, h_q 64). Only where
    the pairs saved outweigh the merge: s_q 64, h_q 64, topk 256 ran 21.4 us split in two against 12.7 whole."""
    tail = n_items % n_sm
    if tail == 0 or n_sm // tail < 2 or n_pairs < 2:
        return n_items, 1, n_pairs
    pp = cdiv(n_pairs, min(n_sm // tail, n_pairs, 16))  # <= 16 pieces: _tail_merge holds them in registers
    n_piece = cdiv(n_pairs, pp)
    merge_us = _MERGE_US + 2 * tail * n_piece * _piece_floats(d_v) * 4 / _PART_BYTES_PER_US
    if (n_pairs - pp) * _PAIR_US <= merge_us:
        return n_items, 1, n_pairs
    return n_items - tail, n_piece, pp


@dataclass(frozen=True)
class FwdWsConfig(KernelConfig):
    """64-row tiles: q (72 KB) + two slots (144 KB) fill shared memory; 232 registers per consumer (O's half alone is
    128), 48 for the producer (40 spills the next pair's indices; notes: sparse_mla_fwd.md, v4-5). TAIL: split the
    last partial wave's items over their topk (tail_split); NSM: the SM count it assumes (tests; None: the GPU's)."""
    BLOCK_N: int = 64
    CONS_REGS: int = 232
    PROD_REGS: int = 48
    TAIL: bool = True
    NSM: Optional[int] = None


def sparse_mla_fwd_ws_launch(a, out, max_logits, lse, sink_in_lse: bool = True, config=None) -> None:
    """As fwd.sparse_mla_fwd_launch, on sm_90 (see wgmma_common.wgmma_usable)."""
    FwdWsPlan(a, out, lse, sink_in_lse, config, kept=False)(a, out, max_logits, lse)


class FwdWsPlan:
    """The launches of one forward call shape on sm_90: the tail split, grids, constexprs and every int argument
    worked out once from a call's canonical arguments (common.SparseArgs) and its out / lse strides. kept=True holds
    the compiled kernels (_launch.Launch) for a cached plan, whose key fixes all of that; kept=False launches through
    the keyed _launch.launch (one call's plan)."""
    __slots__ = ("main", "piece", "merge", "ints", "part_numel", "n_main", "n_piece", "pp", "merge_ints")

    def __init__(self, a, out, lse, sink_in_lse: bool = True, config=None, kept=True):
        q, kv, idx = a.q, a.kv, a.indices
        s_q, h_q, d_qk = q.shape
        cfg = FwdWsConfig.of(config)
        n_hb = cdiv(h_q, 64)
        n_items = s_q * n_hb
        n_main, n_piece, pp = n_items, 1, 0
        n_sm = planned_sms(cfg.NSM, q.device)
        if cfg.TAIL:
            n_main, n_piece, pp = tail_split(n_items, n_sm, cdiv(idx.shape[1], 2 * cfg.BLOCK_N), a.d_v)
        self.n_main, self.n_piece, self.pp = n_main, n_piece, pp
        self.ints = (*row_args(a, n_hb)[2:], q.stride(0), q.stride(1), kv.stride(0), idx.stride(0), out.stride(0),
                     out.stride(1), lse.stride(0), 0)
        flags = dict(D_V=a.d_v, D_T=d_qk - a.d_v, HAS_SINK=a.attn_sink is not None, SINK_IN_LSE=sink_in_lse,
                     num_warps=4, BLOCK_N=cfg.BLOCK_N, CONS_REGS=cfg.CONS_REGS, PROD_REGS=cfg.PROD_REGS,
                     **row_flags(a))
        go = Launch if kept else keyed
        self.main = go(_fwd_see_kernel, (n_main,), **flags) if n_main else None
        self.piece = self.merge = None
        if n_piece > 1:
            n_tail = n_items - n_main
            self.part_numel = n_tail * n_piece * _piece_floats(a.d_v)
            self.piece = go(_fwd_see_kernel, (n_tail * n_piece,), **flags, SPLIT=1)
            self.merge = go(_tail_merge, (n_tail, 64), HAS_SINK=a.attn_sink is not None, SINK_IN_LSE=sink_in_lse,
                            BLOCK_P=next_pow2(n_piece), D_V=a.d_v, num_warps=4)
            self.merge_ints = (n_main, n_piece, n_hb, h_q, out.stride(0), out.stride(1), lse.stride(0))

    def __call__(self, a, out, max_logits, lse) -> None:
        self.run(a.q, a.kv, a.indices, a.attn_sink, a.topk_length, a.q_start_t, out, max_logits, lse)

    def direct(self) -> bool:
        """Every launch goes straight to its kept kernel (see _launch.Launch.direct): run() may then take the
        caller's raw kv [s_kv, 1, d_qk], indices [s_q, 1, topk] and q_start tensor (same addresses)."""
        return all(g.direct() for g in (self.main, self.piece, self.merge) if g is not None)

    def run(self, q, kv, idx, sink, tlen, qs_t, out, max_logits, lse) -> None:
        sink = sink if sink is not None else idx
        head = (q, kv, idx, out, max_logits, lse, sink, *row_ptrs(idx, tlen, qs_t), *self.ints)
        if self.main is not None:
            self.main(*head, 0, 1, 0, lse)
        if self.piece is not None:
            dev = out.device  # eager: the per-stream split scratch (no allocation); a fresh buffer under capture
            part = torch.empty(self.part_numel, dtype=torch.float32, device=dev) if capturing(dev) else \
                split_scratch(dev, self.part_numel, 0)[0]
            self.piece(*head, self.n_main, self.n_piece, self.pp, part)
            self.merge(part, out, max_logits, lse, sink, *self.merge_ints)
