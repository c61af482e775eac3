"""attn_dist for Hopper in Gluon (warp-specialised): q held in the wgmma A-operand registers, kv rows
gathered by a cp.async producer into a STAGES-deep shared-memory ring, so the smem budget goes to gathers in
flight, not to q. Persistent: one program per SM walks the work items (query row, block of 128 heads).

Gluon has no interpreter: the plain-Triton kernel in attn_dist.py is the portable path (and what CPU tests
cover); this one runs on sm_90 and is tested on the GPU (tests marked gpu, scripts/sparse_mla_gluon_device.py).
"""
import torch
import triton

from ..._gluon import (HAVE_GLUON, async_copy, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                       warpgroup_mma_wait)

from ..._runtime import interpreting, num_sms
from .common import LOG2E_C, row_args, row_flags

if HAVE_GLUON:
    @gluon.jit
    def _row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride,
                    HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """(entries of the row to scan, highest visible kv index), as fwd.row_limits."""
        n_len = topk
        if HAS_TLEN:
            n_len = gl.minimum(gl.maximum(gl.load(tlen_ptr + row), 0), topk)
        limit = 2147483647
        if CAUSAL:
            if QS_TENSOR:
                num = row + gl.load(qs_ptr) + 1 - k_stride
            else:
                num = row + q_start + 1 - k_stride
            limit = gl.where(num >= 0, num // k_stride, -1)  # any negative num: nothing visible yet
        return n_len, limit

    @gluon.jit
    def _cvt2(x, dtype: gl.constexpr):
        """fp32 -> bf16 / fp16 two values per instruction (cvt.rn.*x2.f32, same rounding). Triton's own `.to` gave one
        scalar F2F conversion per value in the wgmma accumulator layout."""
        if dtype == gl.bfloat16:
            y = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                          is_pure=True, pack=2)
        else:
            y = gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.float16,
                                          is_pure=True, pack=2)
        return y

    @gluon.jit
    def _ws_idx(idx_ptr, row, t0, n_len, s_im, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Entries [t0, t0 + BLOCK_N) of the row, -1 past n_len. A consumer issues this load early and tests the
        values (_ws_check) only after its next wait: testing them at once stalls the warpgroup on the load's L2
        round trip (~600-1000 clocks a tile; sparse_mla_fwd notes, version 5)."""
        offs = t0 + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_ptr + row * s_im + offs, mask=offs < n_len, other=-1)

    @gluon.jit
    def _ws_check(idx, s_kv, limit, CAUSAL: gl.constexpr):
        """valid = in [0, s_kv) and visible (causal)."""
        valid = (idx >= 0) & (idx < s_kv)
        if CAUSAL:
            valid = valid & (idx <= limit)
        return valid

    @gluon.jit
    def _ws_valid(idx_ptr, row, t0, n_len, s_im, s_kv, limit, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  layout: gl.constexpr):
        """(valid, indices) of entries [t0, t0 + BLOCK_N) of the row: -1 past n_len; valid = in [0, s_kv) and
        visible (causal)."""
        idx = _ws_idx(idx_ptr, row, t0, n_len, s_im, BLOCK_N, layout)
        return _ws_check(idx, s_kv, limit, CAUSAL), idx

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
    def _my_span(n_work, topk):
        """This program's share of the n_work x cdiv(topk, 64) (work item, tile) units, in order: units [u0, u1),
        equal to one tile, so the last round has no idle SMs (4096 rows on 132 SMs: 32 rows for some, 31.03 on
        average). Splitting a row is free here: a tile's column sums depend on that tile alone."""
        n_t = gl.cdiv(topk, 64)
        units = n_work.to(gl.int64) * n_t
        pid = gl.program_id(0)
        g = gl.num_programs(0)
        u0 = pid * units // g
        u1 = (pid + 1) * units // g
        return u0, u1, n_t, (u0 // n_t).to(gl.int32), gl.cdiv(u1, n_t).to(gl.int32)

    @gluon.jit
    def _work_row(w, u0, u1, n_t, n_hb, topk, tlen_ptr, qs_ptr, q_start, k_stride,
                  HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """(row, head block, entries to scan, causal limit, first tile, tiles) of work item w = row * n_hb + head
        block within this program's span [u0, u1): the tiles past the row's length are skipped."""
        row = (w // n_hb).to(gl.int64)
        n_len, limit = _row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        base = w.to(gl.int64) * n_t
        j_lo = gl.maximum(u0 - base, 0).to(gl.int32)
        j_hi = gl.minimum(gl.minimum(u1 - base, n_t).to(gl.int32), gl.cdiv(n_len, 64))
        return row, w % n_hb, n_len, limit, j_lo, gl.maximum(j_hi - j_lo, 0)

    @gluon.jit
    def _ws_producer(q_ptr, kv_ptr, idx_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, n_work, n_hb, h_q, topk,
                     s_kv, q_start, k_stride, s_qm, s_qh, s_kvn, s_im,
                     D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr, NQ: gl.constexpr,
                     HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr):
        """4 warps, persistent: for each work item of this program's span (_my_span), its q ([64 heads, d_qk] per consumer that needs its own: NQ
        ring items) and then its kv tiles, cp.async'ed into ring item k's slot k % STAGES once that slot's readers
        released it. The next item's q and first tiles thus land while the consumers finish the current one."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rl: gl.constexpr = gl.SliceLayout(1, g_l)
        d_lo = gl.arange(0, D_V, layout=gl.SliceLayout(0, g_l))
        d_hi = gl.arange(0, D_T if D_T > 0 else 64, layout=gl.SliceLayout(0, g_l))
        u0, u1, n_t, w_lo, w_hi = _my_span(n_work, topk)
        k = 0
        for w in range(w_lo, w_hi):
            row, hb, n_len, limit, j_lo, n_tiles = _work_row(w, u0, u1, n_t, n_hb, topk, tlen_ptr, qs_ptr, q_start,
                                                             k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
            idx_n = _ws_idx(idx_ptr, row, j_lo * 64, n_len, s_im, 64, rl)  # tested after q's copies are issued
            for c in gl.static_range(NQ):
                s = k % STAGES
                mbarrier.wait(empty.index(s), ((k // STAGES) & 1) ^ 1, pred=k >= STAGES)
                offs_h = (hb * NQ + c) * 64 + gl.arange(0, 64, layout=rl)
                q_rows = q_ptr + row * s_qm + offs_h[:, None].to(gl.int64) * s_qh
                hmask = offs_h[:, None] < h_q  # padded heads read as 0
                async_copy.async_copy_global_to_shared(klo_s.index(s), q_rows + d_lo[None, :], mask=hmask)
                if D_T > 0:
                    async_copy.async_copy_global_to_shared(khi_s.index(s), q_rows + D_V + d_hi[None, :], mask=hmask)
                async_copy.mbarrier_arrive(full.index(s), increment_count=False)
                k += 1
            valid_n = _ws_check(idx_n, s_kv, limit, CAUSAL)
            for j in range(j_lo, j_lo + n_tiles):
                s = k % STAGES
                mbarrier.wait(empty.index(s), ((k // STAGES) & 1) ^ 1, pred=k >= STAGES)
                base = kv_ptr + gl.where(valid_n, idx_n, 0).to(gl.int64)[:, None] * s_kvn
                # next tile's indices now (tested after this tile's copies are issued), so its addresses are ready
                # when its slot frees
                idx_n = _ws_idx(idx_ptr, row, (j + 1) * 64, n_len, s_im, 64, rl)
                async_copy.async_copy_global_to_shared(klo_s.index(s), base + d_lo[None, :], mask=valid_n[:, None])
                if D_T > 0:
                    async_copy.async_copy_global_to_shared(khi_s.index(s), base + D_V + d_hi[None, :],
                                                           mask=valid_n[:, None])
                # each producer thread arrives once its own copies have landed (count = 128)
                async_copy.mbarrier_arrive(full.index(s), increment_count=False)
                valid_n = _ws_check(idx_n, s_kv, limit, CAUSAL)
                k += 1

    @gluon.jit
    def _ws_consumer(idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, n_work, n_hb, h_q, topk,
                     s_kv, q_start, k_stride, qk_scale, s_im, s_lm, s_lh, s_om,
                     CID: gl.constexpr, SPLIT_HEADS: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr,
                     STAGES: gl.constexpr, HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr,
                     ATOMIC: gl.constexpr, GATHER_ONLY: gl.constexpr):
        """One warpgroup: 64 heads x (every tile if SPLIT_HEADS, else every other tile, from the CID-th of the
        item's span), for each work item of this program's span (_my_span).
        Ring items and their readers: SPLIT_HEADS: q of consumer 0, q of consumer 1 (one reader each), then tiles
        (both read); else q (both read), then tiles (one reader). `empty` counts 2: a sole reader arrives twice.
        Consecutive items a consumer waits for are at most 2 apart, so with STAGES >= 2 the slot's previous fill
        has always landed before this consumer tests the parity of the next one."""
        mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 64, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
        col_l: gl.constexpr = gl.SliceLayout(0, mma_l)
        NQ: gl.constexpr = 2 if SPLIT_HEADS else 1
        Q_ARRIVE: gl.constexpr = 2 if SPLIT_HEADS else 1
        T_ARRIVE: gl.constexpr = 1 if SPLIT_HEADS else 2
        j0: gl.constexpr = 0 if SPLIT_HEADS else CID
        jstep: gl.constexpr = 1 if SPLIT_HEADS else 2
        zero = gl.zeros([64, 64], gl.float32, mma_l)
        cols = gl.arange(0, 64, layout=col_l)
        u0, u1, n_t, w_lo, w_hi = _my_span(n_work, topk)
        k = 0
        for w in range(w_lo, w_hi):
            row, hb, n_len, limit, j_lo, n_tiles = _work_row(w, u0, u1, n_t, n_hb, topk, tlen_ptr, qs_ptr, q_start,
                                                             k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
            kq = k + CID if SPLIT_HEADS else k
            s = kq % STAGES
            mbarrier.wait(full.index(s), (kq // STAGES) & 1)
            q_lo = klo_s.index(s).load(a_l)  # q into the wgmma A-operand registers (ordinary shared loads)
            if D_T > 0:
                q_hi = khi_s.index(s).load(a_l)
            gl.thread_barrier()  # the whole warpgroup has read q ...
            mbarrier.arrive(empty.index(s), count=Q_ARRIVE)  # ... so the slot may be refilled
            k += NQ
            offs_hm = (hb * NQ + (CID if SPLIT_HEADS else 0)) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_l))
            # padded heads get lse = +inf, so their probabilities are exactly 0
            lse2 = gl.load(lse_ptr + row * s_lm + offs_hm * s_lh, mask=offs_hm < h_q, other=float("inf"))
            lse2 = lse2 * LOG2E_C
            for j in range(j_lo + j0, j_lo + n_tiles, jstep):
                kk = k + j - j_lo
                s = kk % STAGES
                t = _ws_idx(idx_ptr, row, j * 64, n_len, s_im, 64, col_l)  # tested after the wgmma
                mbarrier.wait(full.index(s), (kk // STAGES) & 1)
                fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
                if GATHER_ONLY:  # probe: the producer's gather rate alone (scripts/sparse_mla_gluon_device.py)
                    gl.thread_barrier()
                    mbarrier.arrive(empty.index(s), count=T_ARRIVE)
                else:
                    acc = warpgroup_mma(q_lo, klo_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
                    if D_T > 0:
                        acc = warpgroup_mma(q_hi, khi_s.index(s).permute((1, 0)), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    gl.thread_barrier()  # the whole warpgroup is done reading slot s ...
                    mbarrier.arrive(empty.index(s), count=T_ARRIVE)  # ... so this consumer releases it
                    p = gl.exp2(acc * qk_scale - lse2[:, None])
                    valid = _ws_check(t, s_kv, limit, CAUSAL)
                    col = gl.sum(gl.where(valid[None, :], p, 0.0), axis=0)  # invalid entries stay exactly 0
                    offs = j * 64 + cols
                    if ATOMIC:  # two adds onto 0: 0 + a + b is exact in either order, so the sum is deterministic
                        gl.atomic_add(out_ptr + row * s_om + offs, col, mask=offs < n_len, sem="relaxed")
                    else:
                        gl.store(out_ptr + row * s_om + offs, col, mask=offs < n_len)
            k += n_tiles

    @gluon.jit
    def _dist_ws_kernel(q_ptr, kv_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr,
                        s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride, n_work,
                        s_qm, s_qh, s_kvn, s_im, s_lm, s_lh, s_om,
                        D_V: gl.constexpr, D_T: gl.constexpr, STAGES: gl.constexpr,
                        HAS_TLEN: gl.constexpr, CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr,
                        SPLIT_HEADS: gl.constexpr, ATOMIC: gl.constexpr, CONS_REGS: gl.constexpr,
                        PROD_REGS: gl.constexpr, num_warps: gl.constexpr, GATHER_ONLY: gl.constexpr = False):
        """Warp-specialised and persistent (each program an equal run of (work item, tile) units): a 4-warp producer stages q and
        gathers kv rows, two consumer warpgroups run wgmma + column sums, so one consumer's exp2/reduction
        overlaps the other's tensor-core work, and one item's q load and first gathers overlap the previous
        item's last tiles."""
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        gl.static_assert(STAGES >= 2, "the ring needs 2 slots (see _ws_consumer)")
        klo_s, khi_s, full, empty = _kv_ring(dtype, STAGES, 64, D_V, D_T, 2)
        # constexpr arguments are listed one by one: built by tuple concatenation they arrive as runtime values
        gl.warp_specialize([
            (_ws_consumer, (idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, n_work, n_hb,
                            h_q, topk, s_kv, q_start, k_stride, qk_scale, s_im, s_lm, s_lh, s_om, 0, SPLIT_HEADS,
                            D_V, D_T, STAGES, HAS_TLEN, CAUSAL, QS_TENSOR, ATOMIC, GATHER_ONLY)),
            (_ws_consumer, (idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, n_work, n_hb,
                            h_q, topk, s_kv, q_start, k_stride, qk_scale, s_im, s_lm, s_lh, s_om, 1, SPLIT_HEADS,
                            D_V, D_T, STAGES, HAS_TLEN, CAUSAL, QS_TENSOR, ATOMIC, GATHER_ONLY)),
            (_ws_producer, (q_ptr, kv_ptr, idx_ptr, tlen_ptr, qs_ptr, klo_s, khi_s, full, empty, n_work, n_hb, h_q,
                            topk, s_kv, q_start, k_stride, s_qm, s_qh, s_kvn, s_im, D_V, D_T, STAGES,
                            2 if SPLIT_HEADS else 1, HAS_TLEN, CAUSAL, QS_TENSOR)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


def rows_16b(t: torch.Tensor, dims) -> bool:
    """Rows of t along dims provably 16-byte aligned for cp.async (16 B a thread): Triton marks an int argument
    divisible by 16 only when its value is (a stride of 5400 elements, 10800 B, is not), so ask that."""
    return t.data_ptr() % 16 == 0 and all(t.stride(d) % 16 == 0 for d in dims)


def wgmma_usable(a) -> bool:
    """True where the Gluon kernels apply: an sm_90 GPU, 16-byte aligned q / kv, strides multiples of 16 elements."""
    q, kv = a.q, a.kv
    if not HAVE_GLUON or interpreting() or q.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    return rows_16b(q, (0, 1)) and rows_16b(kv, (0,))


def attn_dist_ws_launch(a, lse, out, config=None) -> None:
    """As attn_dist.attn_dist_launch: out zero-filled. Deterministic for h_q <= 128 (at most two partial sums per
    entry, added atomically onto 0: exact in either order); above that the last bits may vary between runs."""
    q, kv, idx = a.q, a.kv, a.indices
    s_q, h_q, d_qk = q.shape
    cfg = dict(config or {})
    # 2 x 64 heads on every tile; else both consumers take 64 heads on alternate tiles (SPLIT: a probe override)
    split = bool(cfg.pop("SPLIT", h_q > 64))
    # measured on an H100 (benchmarks/notes/sparse_mla_fwd.md, versions 5 and 6): two ring slots of 64 rows (with the
    # persistent programs, also where the consumers take alternate tiles: 374 vs 362 TFLOP/s at h_q 64); consumers
    # get 232 registers (q alone is 144), the producer the rest
    cfg = {**dict(STAGES=2, CONS_REGS=232, PROD_REGS=48), **cfg}
    n_hb = triton.cdiv(h_q, 128 if split else 64)
    n_work = s_q * n_hb
    # persistent: one CTA per SM (the ring fills shared memory); GRID overrides it (GRID=n_work: one item each)
    grid = min(n_work, cfg.pop("GRID", None) or num_sms(q.device))
    _dist_ws_kernel[(grid,)](
        q, kv, idx, lse, out, *row_args(a, n_hb), n_work,
        q.stride(0), q.stride(1), kv.stride(0), idx.stride(0), lse.stride(0), lse.stride(1), out.stride(0),
        D_V=a.d_v, D_T=d_qk - a.d_v, SPLIT_HEADS=split, ATOMIC=split or n_hb > 1, num_warps=4, **row_flags(a),
        **cfg)
