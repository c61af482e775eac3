"""attn_dist for Hopper in Gluon (warp-specialised): q held in the wgmma A-operand registers, kv rows
gathered by a cp.async producer into a STAGES-deep shared-memory ring, so the smem budget goes to gathers in
flight, not to q. Above 64 heads one program per (query row, block of 128 heads); up to 64 heads one program per pair
of rows (then one per row for the last ones).

Gluon has no interpreter: the plain-Triton kernel in attn_dist.py is the portable path (and what CPU tests
cover); this one runs on sm_90 and is tested on the GPU (tests marked gpu, scripts/memcheck.py).
"""

from dataclasses import dataclass
from typing import Optional

from ..._gluon import (HAVE_GLUON, async_copy, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                       warpgroup_mma_wait)

from ..._config import KernelConfig
from ..._launch import Launch, keyed
from ..._runtime import cdiv, num_sms
from .common import LOG2E_C, row_args, row_flags, row_ptrs

if HAVE_GLUON:
    from .wgmma_common import mma_layout, row_limits, ws_check, ws_idx, ws_valid

    @gluon.jit
    def _kv_ring(dtype: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr,
                 D_T: gl.constexpr, READERS: gl.constexpr):
        """The ring _ws_producer fills: kv[:, :D_V] and kv[:, D_V:] slots, and per slot a `full` barrier (one
        arrival per producer thread, 128) and an `empty` barrier (one per consumer warpgroup reading the slot)."""
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        klo_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_V], sl)
        if D_T > 0:
            khi_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_T], sl)
        else:
            khi_s = klo_s
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=128)
            mbarrier.init(empty.index(i), count=READERS)
        return klo_s, khi_s, full, empty

    @gluon.jit
    def _gather_tile(klo_s, khi_s, full, s, base, valid, D_V: gl.constexpr, D_T: gl.constexpr, g_l: gl.constexpr):
        """cp.async the rows base (kv row pointers, [BLOCK_N, 1]) where valid into ring slot s (columns [0, D_V) and
        the rope), then one arrival per producer thread on full[s] once its own copies have landed (count = 128)."""
        async_copy.async_copy_global_to_shared(
            klo_s.index(s), base + gl.arange(0, D_V, layout=gl.SliceLayout(0, g_l))[None, :], mask=valid[:, None])
        if D_T > 0:
            async_copy.async_copy_global_to_shared(
                khi_s.index(s), base + D_V + gl.arange(0, D_T, layout=gl.SliceLayout(0, g_l))[None, :],
                mask=valid[:, None])
        async_copy.mbarrier_arrive(full.index(s), increment_count=False)

    @gluon.jit
    def _ws_producer(kv_ptr, idx_ptr, klo_s, khi_s, full, empty, q_ready, row, n_len, s_kv, limit, s_kvn, s_im,
                     BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, WAIT_Q: gl.constexpr = True):
        """4 warps: cp.async the rows of tile j into slot j % STAGES once its readers released it (and, with
        WAIT_Q, the slots the consumers stage q through only once they are done with it)."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        n_tiles = gl.cdiv(n_len, BLOCK_N)
        valid_n, idx_n = ws_valid(idx_ptr, row, 0, n_len, s_im, s_kv, limit, BLOCK_N, CAUSAL, gl.SliceLayout(1, g_l))
        for j in range(n_tiles):
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
            if WAIT_Q:
                # the consumers staged q through the last 2 * (64 // BLOCK_N) slots
                mbarrier.wait(q_ready, 0, pred=j == STAGES - 2 * (64 // BLOCK_N))
            valid = valid_n
            base = kv_ptr + gl.where(valid, idx_n, 0).to(gl.int64)[:, None] * s_kvn
            # next tile's indices now (tested after this tile's copies are issued), so its addresses are ready
            # when its slot frees
            idx_n = ws_idx(idx_ptr, row, (j + 1) * BLOCK_N, n_len, s_im, BLOCK_N, gl.SliceLayout(1, g_l))
            _gather_tile(klo_s, khi_s, full, s, base, valid, D_V, D_T, g_l)
            valid_n = ws_check(idx_n, s_kv, limit, CAUSAL)

    @gluon.jit
    def _q_to_regs(q_ptr, row, h0, h_q, has_row, s_qm, s_qh, klo_s, khi_s, q_ready, slot0: gl.constexpr,
                   D_V: gl.constexpr, D_T: gl.constexpr, a_l: gl.constexpr):
        """q [64 heads from h0, d_qk] of one row into the wgmma A-operand registers through ring slot slot0 (64 rows:
        exactly q's shape), which the producer fills only after q_ready: one 16-byte cp.async trip, shared-memory
        loads, then one arrival on q_ready. Returns (q_lo, q_hi); q_hi is q_lo (unused) at d_qk 512."""
        q_lo_s = klo_s.index(slot0)._reinterpret(klo_s.dtype, [64, D_V], klo_s.layout)
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        q_rows = q_ptr + row * s_qm + offs_h[:, None].to(gl.int64) * s_qh
        hmask = (offs_h[:, None] < h_q) & has_row
        async_copy.async_copy_global_to_shared(
            q_lo_s, q_rows + gl.arange(0, D_V, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask)
        if D_T > 0:
            q_hi_s = khi_s.index(slot0)._reinterpret(khi_s.dtype, [64, D_T], khi_s.layout)
            async_copy.async_copy_global_to_shared(
                q_hi_s, q_rows + D_V + gl.arange(0, D_T, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask)
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        q_lo = q_lo_s.load(a_l)
        q_hi = q_lo
        if D_T > 0:
            q_hi = q_hi_s.load(a_l)
        gl.thread_barrier()
        mbarrier.arrive(q_ready, count=1)
        return q_lo, q_hi

    @gluon.jit
    def _ws_consumer(q_ptr, idx_ptr, lse_ptr, out_ptr, klo_s, khi_s, full, empty, q_ready, row, hb, h_q, n_len, s_kv,
                     limit, qk_scale, s_qm, s_qh, s_im, s_lm, s_lh, s_om,
                     CID: gl.constexpr, SPLIT_HEADS: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr,
                     D_T: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, ATOMIC: gl.constexpr):
        """One warpgroup: 64 heads x (every tile if SPLIT_HEADS, else the tiles j = CID mod 2)."""
        mma_l: gl.constexpr = mma_layout(BLOCK_N)
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)
        if SPLIT_HEADS:
            h0 = hb * 128 + CID * 64
            j0 = 0
            jstep = 1
        else:
            h0 = hb * 64
            j0 = CID
            jstep = 2
        # q into the A-operand registers through the ring's last 64 rows (CID 0) or the 64 before (CID 1): the
        # producer fills those slots only after q_ready, so staging costs no shared memory; one cp.async trip
        gl.static_assert(STAGES * BLOCK_N >= 128, "q is staged through 2 x 64 ring rows")
        slot0: gl.constexpr = STAGES - (64 // BLOCK_N) * (CID + 1)  # slots are adjacent rows of one buffer
        q_lo, q_hi = _q_to_regs(q_ptr, row, h0, h_q, True, s_qm, s_qh, klo_s, khi_s, q_ready, slot0, D_V, D_T, a_l)
        offs_hm = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_l))
        # padded heads get lse = +inf, so their probabilities are exactly 0
        lse2 = gl.load(lse_ptr + row * s_lm + offs_hm * s_lh, mask=offs_hm < h_q, other=float("inf"))
        lse2 = lse2 * LOG2E_C
        zero = gl.zeros([64, BLOCK_N], gl.float32, mma_l)
        cols = gl.arange(0, BLOCK_N, layout=col_l)
        n_tiles = gl.cdiv(n_len, BLOCK_N)
        for j in range(j0, n_tiles, jstep):
            s = j % STAGES
            t = ws_idx(idx_ptr, row, j * BLOCK_N, n_len, s_im, BLOCK_N, col_l)  # tested after the wgmma
            mbarrier.wait(full.index(s), (j // STAGES) & 1)
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
            acc = warpgroup_mma(q_lo, klo_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            if D_T > 0:
                acc = warpgroup_mma(q_hi, khi_s.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the whole warpgroup is done reading slot s ...
            mbarrier.arrive(empty.index(s), count=1)  # ... so one arrival releases it for this consumer
            p = gl.exp2(acc * qk_scale - lse2[:, None])
            valid = ws_check(t, s_kv, limit, CAUSAL)
            col = gl.sum(gl.where(valid[None, :], p, 0.0), axis=0)  # invalid entries stay exactly 0
            offs = j * BLOCK_N + cols
            if ATOMIC:  # two adds onto 0: 0 + a + b is exact in either order, so the sum is deterministic
                gl.atomic_add(out_ptr + row * s_om + offs, col, mask=offs < n_len, sem="relaxed")
            else:
                gl.store(out_ptr + row * s_om + offs, col, mask=offs < n_len)

    @gluon.jit
    def _pair_rows(s_q, n_pairs, topk, tlen_ptr, qs_ptr, q_start, k_stride, BLOCK_N: gl.constexpr,
                   HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """This program's rows: programs < n_pairs take rows 2 pid and 2 pid + 1 (ring item k = tile k // 2 of row
        k % 2), the rest one row each (item k = tile k, as _dist_ws_kernel). Returns (pair, row a, row b, n_len a,
        limit a, n_len b, limit b, ring items); row b is row a for a single row, and has no entries past s_q."""
        pid = gl.program_id(0)
        pair = pid < n_pairs
        row_a = gl.where(pair, 2 * pid, n_pairs + pid)
        n_a, lim_a = row_limits(row_a, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        row_b = gl.where(pair, gl.minimum(row_a + 1, s_q - 1), row_a)  # clamped for the loads
        n_b, lim_b = row_limits(row_b, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        n_b = gl.where(pair & (row_a + 1 >= s_q), 0, n_b)
        items = gl.where(pair, 2 * gl.cdiv(gl.maximum(n_a, n_b), BLOCK_N), gl.cdiv(n_a, BLOCK_N))
        return pair, row_a, row_b, n_a, lim_a, n_b, lim_b, items

    @gluon.jit
    def _pair_producer(kv_ptr, idx_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, q_ready, s_q, n_pairs, s_kv, topk,
                       q_start, k_stride, s_kvn, s_im,
                       BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr,
                       HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """4 warps: cp.async the ring items in order (a pair's rows alternately, as many tiles for each as the longer
        row has: past a row's end the copies are masked off)."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        i_l: gl.constexpr = gl.SliceLayout(1, g_l)
        pair, row_a, row_b, n_a, lim_a, n_b, lim_b, items = _pair_rows(
            s_q, n_pairs, topk, tlen_ptr, qs_ptr, q_start, k_stride, BLOCK_N, HAS_TLEN, CAUSAL, QS_TENSOR)
        for k in range(items):
            second = pair & (k % 2 == 1)
            row = gl.where(second, row_b, row_a).to(gl.int64)
            n_len = gl.where(second, n_b, n_a)
            limit = gl.where(second, lim_b, lim_a)
            tile = gl.where(pair, k // 2, k)
            s = k % STAGES
            idx = ws_idx(idx_ptr, row, tile * BLOCK_N, n_len, s_im, BLOCK_N, i_l)  # tested after the wait
            mbarrier.wait(empty.index(s), ((k // STAGES) & 1) ^ 1, pred=k >= STAGES)
            mbarrier.wait(q_ready, 0, pred=k == STAGES - 2 * (64 // BLOCK_N))  # q staged through the last slots
            valid = ws_check(idx, s_kv, limit, CAUSAL)
            base = kv_ptr + gl.where(valid, idx, 0).to(gl.int64)[:, None] * s_kvn
            _gather_tile(klo_s, khi_s, full, s, base, valid, D_V, D_T, g_l)

    @gluon.jit
    def _pair_consumer(q_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, q_ready, s_q,
                       n_pairs, h_q, s_kv, topk, qk_scale, q_start, k_stride, s_qm, s_qh, s_im, s_lm, s_lh, s_om,
                       CID: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr,
                       STAGES: gl.constexpr, HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """One warpgroup, all (<= 64) heads, the ring items k = CID mod 2: every tile of row b (CID 1) or row a (CID 0)
        of a pair, or every other tile of a single row."""
        mma_l: gl.constexpr = mma_layout(BLOCK_N)
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)
        pair, row_a, row_b, n_a, lim_a, n_b, lim_b, items = _pair_rows(
            s_q, n_pairs, topk, tlen_ptr, qs_ptr, q_start, k_stride, BLOCK_N, HAS_TLEN, CAUSAL, QS_TENSOR)
        if CID == 0:
            row = row_a.to(gl.int64)
            n_len = n_a
            limit = lim_a
            has_row = True
        else:
            row = row_b.to(gl.int64)
            n_len = n_b
            limit = lim_b
            has_row = ~pair | (row_a + 1 < s_q)
        # q of this consumer's row into the A-operand registers through ring slot STAGES - 1 - CID (as _ws_consumer)
        gl.static_assert(BLOCK_N == 64, "q is staged through one 64-row slot per consumer")
        q_lo, q_hi = _q_to_regs(q_ptr, row, 0, h_q, has_row, s_qm, s_qh, klo_s, khi_s, q_ready, STAGES - 1 - CID, D_V,
                                D_T, a_l)
        offs_hm = gl.arange(0, 64, layout=gl.SliceLayout(1, mma_l))
        lse2 = gl.load(lse_ptr + row * s_lm + offs_hm * s_lh, mask=(offs_hm < h_q) & has_row, other=float("inf"))
        lse2 = lse2 * LOG2E_C
        zero = gl.zeros([64, BLOCK_N], gl.float32, mma_l)
        cols = gl.arange(0, BLOCK_N, layout=col_l)
        for k in range(CID, items, 2):
            j = gl.where(pair, k // 2, k)  # the tile of the row
            s = k % STAGES
            t = ws_idx(idx_ptr, row, j * BLOCK_N, n_len, s_im, BLOCK_N, col_l)  # tested after the wgmma
            mbarrier.wait(full.index(s), (k // STAGES) & 1)
            fence_async_shared()
            # a tile past this row's end (the other row is longer) is all masked: computed, never stored
            acc = warpgroup_mma(q_lo, klo_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            if D_T > 0:
                acc = warpgroup_mma(q_hi, khi_s.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)
            p = gl.exp2(acc * qk_scale - lse2[:, None])
            valid = ws_check(t, s_kv, limit, CAUSAL)
            col = gl.sum(gl.where(valid[None, :], p, 0.0), axis=0)
            offs = j * BLOCK_N + cols
            gl.store(out_ptr + row * s_om + offs, col, mask=offs < n_len)

    @gluon.jit
    def _dist_pair_kernel(q_ptr, kv_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr,
                          s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride,
                          s_qm, s_qh, s_kvn, s_im, s_lm, s_lh, s_om, s_q, n_pairs,
                          BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr,
                          HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr,
                          CONS_REGS: gl.constexpr, PROD_REGS: gl.constexpr, num_warps: gl.constexpr):
        """h_q <= 64: programs < n_pairs take a pair of rows, a consumer warpgroup per row and one producer alternating
        their tiles through one ring; the rest one row each, the consumers on alternate tiles (as _dist_ws_kernel).
        Each consumer sees a tile every other ring item either way, but a pair pays a program's start (q loads, the
        first gathers) and end (the last tiles' products after the last gather) once for two rows; the single rows
        come last and fill the last wave."""
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        klo_s, khi_s, full, empty = _kv_ring(dtype, STAGES, BLOCK_N, D_V, D_T, 1)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=2)
        gl.warp_specialize([
            (_pair_consumer, (q_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, q_ready,
                              s_q, n_pairs, h_q, s_kv, topk, qk_scale, q_start, k_stride, s_qm, s_qh, s_im, s_lm,
                              s_lh, s_om, 0, BLOCK_N, D_V, D_T, STAGES, HAS_TLEN, CAUSAL, QS_TENSOR)),
            (_pair_consumer, (q_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, q_ready,
                              s_q, n_pairs, h_q, s_kv, topk, qk_scale, q_start, k_stride, s_qm, s_qh, s_im, s_lm,
                              s_lh, s_om, 1, BLOCK_N, D_V, D_T, STAGES, HAS_TLEN, CAUSAL, QS_TENSOR)),
            (_pair_producer, (kv_ptr, idx_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, q_ready, s_q, n_pairs, s_kv,
                              topk, q_start, k_stride, s_kvn, s_im, BLOCK_N, D_V, D_T, STAGES, HAS_TLEN, CAUSAL,
                              QS_TENSOR)),
        ], [4, 4], [CONS_REGS, PROD_REGS])

    @gluon.jit
    def _dist_ws_kernel(q_ptr, kv_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr,
                        s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride,
                        s_qm, s_qh, s_kvn, s_im, s_lm, s_lh, s_om,
                        BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr,
                        HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr,
                        SPLIT_HEADS: gl.constexpr, ATOMIC: gl.constexpr, CONS_REGS: gl.constexpr,
                        PROD_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Warp-specialised: a 4-warp producer gathers, two consumer warpgroups run wgmma + column sums, so one
        consumer's exp2/reduction overlaps the other's tensor-core work and no CTA-wide barrier is needed."""
        pid = gl.program_id(0)
        row = (pid // n_hb).to(gl.int64)
        hb = pid % n_hb
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        klo_s, khi_s, full, empty = _kv_ring(dtype, STAGES, BLOCK_N, D_V, D_T, 2 if SPLIT_HEADS else 1)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=2)
        gl.warp_specialize([
            (_ws_consumer, (q_ptr, idx_ptr, lse_ptr, out_ptr, klo_s, khi_s, full, empty, q_ready, row, hb, h_q,
                            n_len, s_kv, limit, qk_scale, s_qm, s_qh, s_im, s_lm, s_lh, s_om,
                            0, SPLIT_HEADS, BLOCK_N, D_V, D_T, STAGES, CAUSAL, ATOMIC)),
            (_ws_consumer, (q_ptr, idx_ptr, lse_ptr, out_ptr, klo_s, khi_s, full, empty, q_ready, row, hb, h_q,
                            n_len, s_kv, limit, qk_scale, s_qm, s_qh, s_im, s_lm, s_lh, s_om,
                            1, SPLIT_HEADS, BLOCK_N, D_V, D_T, STAGES, CAUSAL, ATOMIC)),
            (_ws_producer, (kv_ptr, idx_ptr, klo_s, khi_s, full, empty, q_ready, row, n_len, s_kv, limit, s_kvn, s_im,
                            BLOCK_N, D_V, D_T, STAGES, CAUSAL)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


def attn_dist_ws_launch(a, lse, out, config=None) -> None:
    """As attn_dist.attn_dist_launch: out zero-filled. Deterministic for h_q <= 128 (at most two partial sums per
    entry, added atomically onto 0: exact in either order); above that the last bits may vary between runs."""
    DistWsPlan(a, lse, out, config, kept=False)(a, lse, out)


@dataclass(frozen=True)
class DistWsConfig(KernelConfig):
    """Slots of BLOCK_N rows, STAGES of them, the consumers' and producer's registers; h_q <= 64: PAIR (two rows a
    program, then SINGLES one-row programs: None = one per SM) or one row a program."""
    BLOCK_N: int = 64
    STAGES: int = 3
    CONS_REGS: int = 232
    PROD_REGS: int = 40
    PAIR: bool = True
    SINGLES: Optional[int] = None


# measured on an H100 (benchmarks/notes/sparse_mla_fwd.md, version 5): slots of 64 rows, 3 where the consumers take
# alternate tiles, 2 where both read every tile (507-514 vs 490 TFLOP/s at h_q 128); consumers get 232 registers (q
# alone is 144). h_q <= 64: pairs of rows per program (notes version 9: 431-438 -> 451-453 TFLOP/s at h_q 64)
SPLIT_DEFAULT = DistWsConfig(STAGES=2, PROD_REGS=48, PAIR=False)
PAIR_DEFAULT = DistWsConfig()


class DistWsPlan:
    """The launch of one attn_dist call shape on sm_90, worked out once (as fwd_wgmma.FwdWsPlan: kept=True holds the
    compiled kernel for a cached plan, kept=False launches through the keyed _launch.launch)."""
    __slots__ = ("go", "ints")

    def __init__(self, a, lse, out, config=None, kept=True):
        q, kv, idx = a.q, a.kv, a.indices
        s_q, h_q, d_qk = q.shape
        split = h_q > 64  # 2 x 64 heads on every tile; else both consumers take 64 heads on alternate tiles
        cfg = DistWsConfig.of(config, SPLIT_DEFAULT if split else PAIR_DEFAULT)
        kw = dict(BLOCK_N=cfg.BLOCK_N, STAGES=cfg.STAGES, CONS_REGS=cfg.CONS_REGS, PROD_REGS=cfg.PROD_REGS)
        go = Launch if kept else keyed
        strides = (q.stride(0), q.stride(1), kv.stride(0), idx.stride(0), lse.stride(0), lse.stride(1), out.stride(0))
        if not split and cfg.PAIR:
            # pairs of rows, then SINGLES single-row programs (default: one per SM) to even out the last wave
            singles = min(s_q, cfg.SINGLES if cfg.SINGLES is not None else num_sms(q.device))
            n_pairs = (s_q - singles) // 2
            self.ints = (*row_args(a, 1)[2:], *strides, s_q, n_pairs)
            self.go = go(_dist_pair_kernel, (s_q - n_pairs,), D_V=a.d_v, D_T=d_qk - a.d_v, num_warps=4,
                         **row_flags(a), **kw)
            return
        n_hb = cdiv(h_q, 128 if split else 64)
        self.ints = (*row_args(a, n_hb)[2:], *strides)
        self.go = go(_dist_ws_kernel, (s_q * n_hb,), D_V=a.d_v, D_T=d_qk - a.d_v, SPLIT_HEADS=split,
                     ATOMIC=split or n_hb > 1, num_warps=4, **row_flags(a), **kw)

    def __call__(self, a, lse, out) -> None:
        self.run(a.q, a.kv, a.indices, a.topk_length, a.q_start_t, lse, out)

    def direct(self) -> bool:
        return self.go.direct()  # a kept plan only (see FwdWsPlan.direct)

    def run(self, q, kv, idx, tlen, qs_t, lse, out) -> None:
        self.go(q, kv, idx, lse, out, *row_ptrs(idx, tlen, qs_t), *self.ints)
