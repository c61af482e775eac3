"""The backward's two passes (bwd._probs_kernel, bwd._grads_kernel) for Hopper in Gluon, used on sm_90.

First pass, one program per (query row, 64 heads), warp-specialised like the forward: a 4-warp producer gathers
64-row kv tiles into two shared-memory slots; on each tile consumer 0 computes S = q k^T (q in shared memory) and
P = exp(S * scale - lse), consumer 1 at the same time dP = dO V^T (dO held in its wgmma A-operand registers), then
dS = P (dP - Delta) with P handed over through the slot's rope columns (only S reads them). Both write their tile
(bf16) to the scratch the second pass reads.
Second pass, one program per (128-column chunk, query row, block of 128 or 64 heads): consumer 0 accumulates dQ,
consumer 1 the gathered rows' dKV, added with 16-byte reductions. Measured history: benchmarks/notes/sparse_mla_bwd.md.
"""

from dataclasses import dataclass

from ..._runtime import cdiv
from ..._gluon import (HAVE_GLUON, async_copy, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                       warpgroup_mma_wait)
from ..._config import KernelConfig
from ..._launch import Launch, keyed
from .common import LOG2E, LOG2E_C, column_parts, row_ptrs

if HAVE_GLUON:
    from .wgmma_common import cvt2, mma_layout, q_and_slots, row_limits, ws_check, ws_idx, ws_valid

    @gluon.jit
    def _p_producer(kv_ptr, idx_ptr, klo_s, khi_s, full, empty, do_ready, row, n_len, s_kv, limit, s_kvn, s_im,
                    BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, CAUSAL: gl.constexpr):
        """4 warps: tile j into slot j % 2 once both consumers released it; slot 1 only after consumer 1 has
        taken dO out of it."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rl: gl.constexpr = gl.SliceLayout(1, g_l)
        d_lo = gl.arange(0, D_V, layout=gl.SliceLayout(0, g_l))
        d_hi = gl.arange(0, D_T if D_T > 0 else 16, layout=gl.SliceLayout(0, g_l))
        valid_n, idx_n = ws_valid(idx_ptr, row, 0, n_len, s_im, s_kv, limit, BLOCK_N, CAUSAL, rl)
        for j in range(gl.cdiv(n_len, BLOCK_N)):
            s = j % 2
            mbarrier.wait(empty.index(s), ((j // 2) & 1) ^ 1, pred=j >= 2)
            mbarrier.wait(do_ready, 0, pred=j == 1)
            valid = valid_n
            base = kv_ptr + gl.where(valid, idx_n, 0).to(gl.int64)[:, None] * s_kvn
            idx_n = ws_idx(idx_ptr, row, (j + 1) * BLOCK_N, n_len, s_im, BLOCK_N, rl)  # tested after the copies
            async_copy.async_copy_global_to_shared(klo_s.index(s), base + d_lo[None, :], mask=valid[:, None])
            if D_T > 0:
                async_copy.async_copy_global_to_shared(khi_s.index(s), base + D_V + d_hi[None, :],
                                                       mask=valid[:, None])
            async_copy.mbarrier_arrive(full.index(s), increment_count=False)
            valid_n = ws_check(idx_n, s_kv, limit, CAUSAL)

    @gluon.jit
    def _p_consumer(q_ptr, idx_ptr, lse_ptr, p_ptr, key_ptr, klo_s, khi_s, qlo_s, qhi_s, full, empty, pready, r, row,
                    hb, h_q, topk, n_len, s_kv, limit, scale_log2, s_qm, s_qh, s_im, s_lm, s_lh, zero,
                    BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, CAUSAL: gl.constexpr,
                    WRITE_KEYS: gl.constexpr):
        """Consumer 0: S and P of every tile; P to the scratch and, through the slot's rope columns, to consumer 1."""
        s_l: gl.constexpr = mma_layout(BLOCK_N)
        row_l: gl.constexpr = gl.SliceLayout(1, s_l)
        col_l: gl.constexpr = gl.SliceLayout(0, s_l)
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_h = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        q_rows = q_ptr + row * s_qm + offs_h[:, None].to(gl.int64) * s_qh
        hmask = offs_h[:, None] < h_q
        async_copy.async_copy_global_to_shared(
            qlo_s, q_rows + gl.arange(0, D_V, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask)
        if D_T > 0:
            async_copy.async_copy_global_to_shared(
                qhi_s, q_rows + D_V + gl.arange(0, D_T, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask)
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        fence_async_shared()
        heads = hb * 64 + gl.arange(0, 64, layout=row_l)
        hm = heads < h_q
        # padded heads: lse = +inf, so P = 0
        lse2 = gl.load(lse_ptr + row * s_lm + heads * s_lh, mask=hm, other=float("inf")) * LOG2E_C
        st_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte stores, 128 B per row
        heads_st = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))
        buf_rows = (r * h_q + heads_st).to(gl.int64) * topk
        q3_s = qlo_s._reinterpret(qlo_s.dtype, [1, 64, D_V], qlo_s.layout)
        zero_s = gl.zeros([64, BLOCK_N], gl.float32, s_l)
        for j in range(gl.cdiv(n_len, BLOCK_N)):
            s = j % 2
            z = zero * j  # runtime 0: keeps the wgmma descriptors in the loop (fwd_wgmma.py)
            t = ws_idx(idx_ptr, row, j * BLOCK_N, n_len, s_im, BLOCK_N, col_l)  # tested after S
            offs = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_l)
            offs_st = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_l))
            mbarrier.wait(full.index(s), (j // 2) & 1)
            fence_async_shared()
            sa = warpgroup_mma(q3_s.index(z), klo_s.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if D_T > 0:
                sa = warpgroup_mma(qhi_s, khi_s.index(s).permute((1, 0)), sa, is_async=True)
            sa = warpgroup_mma_wait(num_outstanding=0, deps=(sa,))
            valid = ws_check(t, s_kv, limit, CAUSAL)
            p = gl.where(valid[None, :], gl.exp2(sa * scale_log2 - lse2[:, None]), 0.0)
            p16 = cvt2(p, p_ptr.dtype.element_ty)
            gl.thread_barrier()  # every warp's S read of the rope is done before P goes over it
            khi_s.index(s).store(p16)
            gl.thread_barrier()
            # read back in rows of 16-byte pieces: the wgmma layout's 4-byte stores cost the L2 twice as much
            p_st = khi_s.index(s).load(st_l)
            gl.thread_barrier()
            mbarrier.arrive(pready.index(s), count=1)
            mbarrier.arrive(empty.index(s), count=1)  # the slot refills once consumer 1 is done with it too
            # the whole tile, zeros past n_len included: the second pass then reads it with a mask that is constant
            # over 16-byte pieces (topk % 16 == 0 there)
            gl.store(p_ptr + buf_rows[:, None] + offs_st[None, :], p_st,
                     mask=(heads_st < h_q)[:, None] & (offs_st < topk)[None, :])
            if WRITE_KEYS:
                if hb == 0:  # sort keys for the deterministic reduction: kv row, or s_kv for invalid slots
                    gl.store(key_ptr + r.to(gl.int64) * topk + offs, gl.where(valid, t, s_kv), mask=offs < n_len)

    @gluon.jit
    def _ds_consumer(o_ptr, do_ptr, dlse_ptr, ds_ptr, delta_ptr, klo_s, khi_s, full, empty, pready, do_ready, r, row,
                     hb, h_q, topk, n_len, s_or, s_oh, s_dor, s_doh, s_dlr, s_dlh, zero, ds_scale,
                     BLOCK_N: gl.constexpr, D_V: gl.constexpr, HAS_DLSE: gl.constexpr):
        """Consumer 1: Delta, then dP and dS of every tile."""
        s_l: gl.constexpr = mma_layout(BLOCK_N)
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, s_l)
        # Delta = rowsum(dO * O) in column chunks (a whole [64, 512] fp32 product would not fit the registers);
        # dO goes to registers through slot 1, which the producer fills only after do_ready
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        DC: gl.constexpr = 128
        offs_h = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_l))
        hmask = (offs_h < h_q)[:, None]
        o_rows = o_ptr + row * s_or + offs_h[:, None].to(gl.int64) * s_oh
        do_rows = do_ptr + row * s_dor + offs_h[:, None].to(gl.int64) * s_doh
        delta = gl.zeros([64], gl.float32, gl.SliceLayout(1, ld_l))
        for c in gl.static_range(D_V // DC):
            d = c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, ld_l))
            dov = gl.load(do_rows + d[None, :], mask=hmask, other=0.0)
            ov = gl.load(o_rows + d[None, :], mask=hmask, other=0.0)
            delta += gl.sum(dov.to(gl.float32) * ov.to(gl.float32), axis=1)
            klo_s.index(1).slice(c * DC, DC, dim=1).store(dov)
        if HAS_DLSE:  # the lse output's gradient enters dS like -Delta: dS = P * (dP - (Delta - dlse))
            delta -= gl.load(dlse_ptr + row * s_dlr + offs_h * s_dlh, mask=offs_h < h_q, other=0.0)
        gl.store(delta_ptr + row * h_q + offs_h, delta, mask=offs_h < h_q)
        gl.thread_barrier()
        do_a = klo_s.index(1).load(a_l)
        gl.thread_barrier()
        mbarrier.arrive(do_ready, count=1)
        delta = gl.convert_layout(delta, row_l)
        st_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        heads_st = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))
        buf_rows = (r * h_q + heads_st).to(gl.int64) * topk
        zero_s = gl.zeros([64, BLOCK_N], gl.float32, s_l)
        for j in range(gl.cdiv(n_len, BLOCK_N)):
            s = j % 2
            z = zero * j
            offs_st = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, st_l))
            mbarrier.wait(full.index(s), (j // 2) & 1)
            fence_async_shared()
            dp = warpgroup_mma(do_a, klo_s.index(s + z).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            dp, do_a = warpgroup_mma_wait(num_outstanding=0, deps=(dp, do_a))
            mbarrier.wait(pready.index(s), (j // 2) & 1)
            p = khi_s.index(s).load(s_l).to(gl.float32)
            ds = p * (dp - delta[:, None]) * ds_scale  # sm_scale here (Gluon second pass) or there (Triton's)
            gl.thread_barrier()  # P read by every warp (consumer 0 read its copy before pready): dS goes over it
            khi_s.index(s).store(cvt2(ds, ds_ptr.dtype.element_ty))
            gl.thread_barrier()
            ds_st = khi_s.index(s).load(st_l)
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)
            gl.store(ds_ptr + buf_rows[:, None] + offs_st[None, :], ds_st,
                     mask=(heads_st < h_q)[:, None] & (offs_st < topk)[None, :])

    @gluon.jit(do_not_specialize=["zero"])
    def _probs_ws_kernel(q_ptr, kv_ptr, o_ptr, do_ptr, idx_ptr, lse_ptr, dlse_ptr, qs_ptr, tlen_ptr, p_ptr, ds_ptr,
                         delta_ptr, key_ptr, row0, n_hb, h_q, s_kv, topk, q_start, k_stride, scale_log2,
                         s_qm, s_qh, s_kvn, s_or, s_oh, s_dor, s_doh, s_im, s_lm, s_lh, s_dlr, s_dlh, zero, ds_scale,
                         BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr, CAUSAL: gl.constexpr,
                         QS_TENSOR: gl.constexpr, HAS_TLEN: gl.constexpr, HAS_DLSE: gl.constexpr,
                         WRITE_KEYS: gl.constexpr, CONS_REGS: gl.constexpr, PROD_REGS: gl.constexpr,
                         num_warps: gl.constexpr):
        pid = gl.program_id(0)
        r = pid // n_hb  # row inside this chunk (scratch row); head blocks of a row side by side share its gathers
        hb = pid % n_hb
        row = (row0 + r).to(gl.int64)
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        klo_s, khi_s, qlo_s, qhi_s = q_and_slots(dtype, BLOCK_N, D_V, D_T)
        full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        pready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for k in gl.static_range(2):
            mbarrier.init(full.index(k), count=128)  # one arrival per producer thread
            mbarrier.init(empty.index(k), count=2)
            mbarrier.init(pready.index(k), count=1)
        mbarrier.init(do_ready, count=1)
        gl.warp_specialize([
            (_p_consumer, (q_ptr, idx_ptr, lse_ptr, p_ptr, key_ptr, klo_s, khi_s, qlo_s, qhi_s, full, empty, pready, r,
                           row, hb, h_q, topk, n_len, s_kv, limit, scale_log2, s_qm, s_qh, s_im, s_lm, s_lh, zero,
                           BLOCK_N, D_V, D_T, CAUSAL, WRITE_KEYS)),
            (_ds_consumer, (o_ptr, do_ptr, dlse_ptr, ds_ptr, delta_ptr, klo_s, khi_s, full, empty, pready, do_ready,
                            r, row, hb, h_q, topk, n_len, s_or, s_oh, s_dor, s_doh, s_dlr, s_dlh, zero, ds_scale,
                            BLOCK_N, D_V, HAS_DLSE)),
            (_p_producer, (kv_ptr, idx_ptr, klo_s, khi_s, full, empty, do_ready, row, n_len, s_kv, limit, s_kvn, s_im,
                           BLOCK_N, D_V, D_T, CAUSAL)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


@dataclass(frozen=True)
class ProbsWsConfig(KernelConfig):
    """The first pass on sm_90: 64-row slots; 232 registers per consumer, 40 for the producer."""
    BLOCK_N: int = 64
    CONS_REGS: int = 232
    PROD_REGS: int = 40


def probs_ws_launch(args, out, dout, lse, dl, has_dlse: bool, p_buf, ds_buf, delta, keys, row0: int, nr: int,
                    write_keys: bool, scaled_ds: bool = False, config=None) -> None:
    """bwd._probs_kernel's work for rows [row0, row0 + nr) on sm_90 (see wgmma_common.wgmma_usable); with
    scaled_ds the scratch gets sm_scale * dS (what grads_ws_launch expects; the Triton second pass scales itself)."""
    ProbsWs(args, out, dout, lse, dl, has_dlse, nr, write_keys, scaled_ds, config, kept=False)(
        args, out, dout, lse, dl, p_buf, ds_buf, delta, keys, row0)


class ProbsWs:
    """probs_ws_launch's launch for nr rows, worked out once (kept=True: the compiled kernel held, for a cached plan
    whose key fixes shapes, strides and row0; see fwd_wgmma.FwdWsPlan)."""
    __slots__ = ("go", "ints")

    def __init__(self, args, out, dout, lse, dl, has_dlse, nr, write_keys, scaled_ds=False, config=None, kept=True):
        q, kv, idx = args.q, args.kv, args.indices
        h_q, d_qk = q.shape[1:]
        cfg = ProbsWsConfig.of(config)
        n_hb = cdiv(h_q, 64)
        self.ints = (n_hb, h_q, kv.shape[0], idx.shape[1], args.q_start_int, args.k_stride, args.sm_scale * LOG2E,
                     q.stride(0), q.stride(1), kv.stride(0), out.stride(0), out.stride(1), dout.stride(0),
                     dout.stride(1), idx.stride(0), lse.stride(0), lse.stride(1), dl.stride(0), dl.stride(1), 0,
                     args.sm_scale if scaled_ds else 1.0)
        self.go = (Launch if kept else keyed)(
            _probs_ws_kernel, (nr * n_hb,), D_V=args.d_v, D_T=d_qk - args.d_v, CAUSAL=args.causal,
            QS_TENSOR=args.q_start_t is not None, HAS_TLEN=args.topk_length is not None, HAS_DLSE=has_dlse,
            WRITE_KEYS=write_keys, num_warps=4, **dict(cfg))

    def direct(self) -> bool:
        return self.go.direct()

    def __call__(self, args, out, dout, lse, dl, p_buf, ds_buf, delta, keys, row0) -> None:
        self.run(args.q, args.kv, args.indices, args.topk_length, args.q_start_t, out, dout, lse, dl, p_buf, ds_buf,
                 delta, keys, row0)

    def run(self, q, kv, idx, tlen, qs_t, out, dout, lse, dl, p_buf, ds_buf, delta, keys, row0) -> None:
        tlen, qs_t = row_ptrs(idx, tlen, qs_t)
        self.go(q, kv, out, dout, idx, lse, dl, qs_t, tlen, p_buf, ds_buf, delta, keys, row0, *self.ints)


# --- second pass: dQ and dKV per (column chunk, query row, block of heads) --------------------------------------
if HAVE_GLUON:
    @gluon.jit
    def _g_producer(kv_ptr, idx_ptr, p_ptr, ds_ptr, k_s, dsb_s, pb_s, full, empty, r, row, hb, h_q, topk, n_len, s_kv,
                    limit, s_kvn, s_im, c, D0: gl.constexpr, DC: gl.constexpr, BH: gl.constexpr, BN: gl.constexpr,
                    STAGES: gl.constexpr, HAS_V: gl.constexpr, CAUSAL: gl.constexpr):
        """4 warps: per tile, the gathered kv columns [D0, D0 + DC) and the dS (and P) tile [BH heads, BN slots]
        of the scratch; heads past h_q are zero-filled (the scratch holds other rows there). Slots past n_len hold
        zeros: the first pass (_p_consumer, _ds_consumer) writes whole tiles."""
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rl: gl.constexpr = gl.SliceLayout(1, g_l)
        cl: gl.constexpr = gl.SliceLayout(0, g_l)
        d = D0 + c * DC + gl.arange(0, DC, layout=cl)
        heads = hb * BH + gl.arange(0, BH, layout=rl)
        buf_rows = (r * h_q + heads).to(gl.int64) * topk
        hmask = heads < h_q
        cols = gl.arange(0, BN, layout=cl)
        valid_n, idx_n = ws_valid(idx_ptr, row, 0, n_len, s_im, s_kv, limit, BN, CAUSAL, rl)
        for j in range(gl.cdiv(n_len, BN)):
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
            valid = valid_n
            base = kv_ptr + gl.where(valid, idx_n, 0).to(gl.int64)[:, None] * s_kvn
            idx_n = ws_idx(idx_ptr, row, (j + 1) * BN, n_len, s_im, BN, rl)  # tested after the copies
            async_copy.async_copy_global_to_shared(k_s.index(s), base + d[None, :], mask=valid[:, None])
            offs = j * BN + cols
            m = hmask[:, None] & (offs < topk)[None, :]
            async_copy.async_copy_global_to_shared(dsb_s.index(s), ds_ptr + buf_rows[:, None] + offs[None, :], mask=m)
            if HAS_V:
                async_copy.async_copy_global_to_shared(pb_s.index(s), p_ptr + buf_rows[:, None] + offs[None, :],
                                                       mask=m)
            async_copy.mbarrier_arrive(full.index(s), increment_count=False)
            valid_n = ws_check(idx_n, s_kv, limit, CAUSAL)

    @gluon.jit
    def _red_staged(idx_ptr, dkv_ptr, stg, stg_full, stg_free, row, j, n_len, s_kv, limit, s_im, s_dkvr,
                    c, D0: gl.constexpr, DC: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
                    CAUSAL: gl.constexpr):
        """Tile j's dKV rows, staged in shared memory by consumer 1, added with 16-byte reductions in pieces of
        4096 values (32 registers: consumer 0 also holds dQ); the buffer is released once the last piece is read."""
        red_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        NP: gl.constexpr = BN * DC // 4096
        gl.static_assert(NP <= 4, "index loads are issued for up to 4 pieces")
        b = j % NB
        # every piece's indices before the wait, tested after it: their L2 round trip overlaps the wait
        PN: gl.constexpr = BN // NP
        il: gl.constexpr = gl.SliceLayout(1, red_l)
        t0 = ws_idx(idx_ptr, row, j * BN, n_len, s_im, PN, il)
        t1 = t0
        t2 = t0
        t3 = t0
        if NP > 1:
            t1 = ws_idx(idx_ptr, row, j * BN + PN, n_len, s_im, PN, il)
        if NP > 2:
            t2 = ws_idx(idx_ptr, row, j * BN + 2 * PN, n_len, s_im, PN, il)
            t3 = ws_idx(idx_ptr, row, j * BN + 3 * PN, n_len, s_im, PN, il)
        mbarrier.wait(stg_full.index(b), (j // NB) & 1)
        dr = D0 + c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, red_l))
        for p in gl.static_range(NP):
            if p == 0:
                t = t0
            elif p == 1:
                t = t1
            elif p == 2:
                t = t2
            else:
                t = t3
            v = ws_check(t, s_kv, limit, CAUSAL)
            g = stg.index(b).slice(p * PN, PN, dim=0).load(red_l)
            if p == NP - 1:
                gl.thread_barrier()
                mbarrier.arrive(stg_free.index(b), count=1)
            gl.atomic_add(dkv_ptr + t.to(gl.int64)[:, None] * s_dkvr + dr[None, :], g, mask=v[:, None],
                          sem="relaxed")

    @gluon.jit
    def _dq_consumer(dq_ptr, idx_ptr, dkv_ptr, k_s, dsb_s, stg, full, empty, stg_full, stg_free, row, hb, h_q, n_len,
                     s_kv, limit, s_im, s_dkvr, s_dqr, s_dqh, sm_scale,
                     c, D0: gl.constexpr, DC: gl.constexpr, BH: gl.constexpr, BN: gl.constexpr,
                     STAGES: gl.constexpr, NB: gl.constexpr, HANDOFF: gl.constexpr, CAUSAL: gl.constexpr,
                     DS_SCALED: gl.constexpr):
        """dQ[:, chunk] = sm_scale * sum over tiles of dS K[:, chunk], in registers (BH / 64 wgmma row blocks); the
        scratch's dS comes scaled by sm_scale already (DS_SCALED: bf16) or not (fp16: small dS would go subnormal).
        HANDOFF: also issues consumer 1's dKV reductions of the previous tile while its own wgmmas run, so that
        consumer 1's next products do not wait behind the reductions (bound by the L2's reduction rate)."""
        o_l: gl.constexpr = mma_layout(DC)
        acc0 = gl.zeros([64, DC], gl.float32, o_l)
        acc1 = gl.zeros([64, DC], gl.float32, o_l)
        n_t = gl.cdiv(n_len, BN)
        for j in range(n_t):
            s = j % STAGES
            mbarrier.wait(full.index(s), (j // STAGES) & 1)
            fence_async_shared()
            acc0 = warpgroup_mma(dsb_s.index(s).slice(0, 64, dim=0), k_s.index(s), acc0, is_async=True)
            if BH == 128:
                acc1 = warpgroup_mma(dsb_s.index(s).slice(64, 64, dim=0), k_s.index(s), acc1, is_async=True)
            if HANDOFF:
                if j > 0:
                    _red_staged(idx_ptr, dkv_ptr, stg, stg_full, stg_free, row, j - 1, n_len, s_kv, limit, s_im,
                                s_dkvr, c, D0, DC, BN, NB, CAUSAL)
            if BH == 128:
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            else:  # acc1 stays out of the loop (DC 256 needs all 128 registers of acc0)
                acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)
        if HANDOFF:
            if n_t > 0:
                _red_staged(idx_ptr, dkv_ptr, stg, stg_full, stg_free, row, n_t - 1, n_len, s_kv, limit, s_im,
                            s_dkvr, c, D0, DC, BN, NB, CAUSAL)
        # the producer is done and only this warpgroup reads k_s: dQ goes through its slots ([BN = 64, DC] each)
        # and out as 16-byte row pieces, not as 4-byte pieces of 8 rows from the wgmma layout (the forward's
        # epilogue lost ~8 % of a program to those; benchmarks/notes/sparse_mla_fwd.md, version 13)
        gl.static_assert(BN == 64 and STAGES * 64 >= BH, "dQ staging takes one k slot per 64 heads")
        for b in gl.static_range(BH // 64):
            a = acc0 if b == 0 else acc1
            if not DS_SCALED:
                a = a * sm_scale
            k_s.index(b).store(a.to(k_s.dtype))
        gl.thread_barrier()
        st_l: gl.constexpr = gl.BlockedLayout([1, 8], [256 // DC, DC // 8], [4, 1], [1, 0])  # DC <= 256
        offs_ds = D0 + c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, st_l))
        for b in gl.static_range(BH // 64):
            heads = hb * BH + b * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))
            gl.store(dq_ptr + row * s_dqr + heads[:, None].to(gl.int64) * s_dqh + offs_ds[None, :],
                     k_s.index(b).load(st_l).to(dq_ptr.dtype.element_ty), mask=(heads < h_q)[:, None])

    @gluon.jit
    def _dkv_consumer(q_ptr, do_ptr, idx_ptr, dkv_ptr, k_s, dsb_s, pb_s, qc_s, doc_s, stg, full, empty, stg_full,
                      stg_free, r, row, hb, h_q, sm_scale,
                      topk, n_len, n_hb, s_kv, limit, s_qm, s_qh, s_dor, s_doh, s_im, s_dkvr,
                      c, D0: gl.constexpr, DC: gl.constexpr, BH: gl.constexpr, BN: gl.constexpr,
                      STAGES: gl.constexpr, HAS_V: gl.constexpr, CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr,
                      NB: gl.constexpr, DS_SCALED: gl.constexpr):
        """Per tile, the kv rows' gradient [BN, chunk] = sm_scale dS^T q[:, chunk] (+ P^T dO[:, chunk]): stored per
        listing (deterministic), or put in a shared-memory buffer (one of NB) whose fp32 reductions into the dKV
        buffer consumer 0 issues (RED 3 in the notes; 16-byte reductions issued here after a layout change, RED 0,
        and 8-byte ones straight from the wgmma layout measured slower: notes, versions 6 and RED 3; the RED switch
        is at d0673ea)."""
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        heads = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, ld_l))
        hmask = (heads < h_q)[:, None]
        # D0 + c * DC with D0, DC constexpr: the compiler sees 16-byte aligned columns (vector reductions)
        d = D0 + c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, ld_l))
        async_copy.async_copy_global_to_shared(
            qc_s, q_ptr + row * s_qm + heads[:, None].to(gl.int64) * s_qh + d[None, :], mask=hmask)
        if HAS_V:
            async_copy.async_copy_global_to_shared(
                doc_s, do_ptr + row * s_dor + heads[:, None].to(gl.int64) * s_doh + d[None, :], mask=hmask)
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        fence_async_shared()
        g_l: gl.constexpr = mma_layout(DC)
        red_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])  # 4 fp32 a thread: v4 reductions
        dr = D0 + c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, red_l))
        for j in range(gl.cdiv(n_len, BN)):
            s = j % STAGES
            t = ws_idx(idx_ptr, row, j * BN, n_len, s_im, BN, gl.SliceLayout(1, red_l))  # tested after the wgmma
            mbarrier.wait(full.index(s), (j // STAGES) & 1)
            fence_async_shared()
            # the K role of each gathered row (sm_scale dS), then the V role (first 512 columns): one chain when the
            # scratch holds dS scaled already
            g = warpgroup_mma(dsb_s.index(s).permute((1, 0)), qc_s, gl.zeros([BN, DC], gl.float32, g_l), use_acc=False,
                              is_async=True)
            if not DS_SCALED:
                g = warpgroup_mma_wait(num_outstanding=0, deps=(g,)) * sm_scale
            if HAS_V:
                g = warpgroup_mma(pb_s.index(s).permute((1, 0)), doc_s, g, is_async=True)
            g = warpgroup_mma_wait(num_outstanding=0, deps=(g,))
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s), count=1)
            valid = ws_check(t, s_kv, limit, CAUSAL)
            if DETERMINISTIC:  # contribution of (row, head block, slot); summed in a fixed order later
                gr = gl.convert_layout(g, red_l)
                offs = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, red_l))
                crow = ((r * n_hb + hb).to(gl.int64) * topk + offs) * s_dkvr
                gl.store(dkv_ptr + crow[:, None] + dr[None, :], gr, mask=valid[:, None])
            else:
                b = j % NB
                mbarrier.wait(stg_free.index(b), ((j // NB) & 1) ^ 1, pred=j >= NB)
                stg.index(b).store(g)
                gl.thread_barrier()
                mbarrier.arrive(stg_full.index(b), count=1)

    @gluon.jit
    def _grads_ws_kernel(q_ptr, kv_ptr, do_ptr, idx_ptr, qs_ptr, tlen_ptr, p_ptr, ds_ptr, dq_ptr, dkv_ptr,
                         row0, h_q, s_kv, topk, q_start, k_stride, n_hb, sm_scale,
                         s_qm, s_qh, s_kvn, s_dor, s_doh, s_im, s_dqr, s_dqh, s_dkvr,
                         D0: gl.constexpr, DC: gl.constexpr, BH: gl.constexpr, BN: gl.constexpr,
                         STAGES: gl.constexpr, HAS_V: gl.constexpr, DETERMINISTIC: gl.constexpr,
                         CAUSAL: gl.constexpr, QS_TENSOR: gl.constexpr, HAS_TLEN: gl.constexpr, NB: gl.constexpr,
                         DS_SCALED: gl.constexpr, CONS_REGS: gl.constexpr, PROD_REGS: gl.constexpr,
                         num_warps: gl.constexpr):
        c = gl.program_id(0)  # column chunk: neighbours share a row's P / dS, read once from DRAM
        r = gl.program_id(1)
        hb = gl.program_id(2)
        row = (row0 + r).to(gl.int64)
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BN, DC], sl)
        dsb_s = gl.allocate_shared_memory(dtype, [STAGES, BH, BN], sl)
        pb_s = gl.allocate_shared_memory(dtype, [STAGES, BH, BN], sl) if HAS_V else dsb_s
        qc_s = gl.allocate_shared_memory(dtype, [BH, DC], sl)
        doc_s = gl.allocate_shared_memory(dtype, [BH, DC], sl) if HAS_V else qc_s
        handoff: gl.constexpr = not DETERMINISTIC
        # fp32 staging of consumer 1's tiles (16-byte units swizzled by row: conflict-free v2 writes, v4 reads)
        stg = gl.allocate_shared_memory(gl.float32, [NB if handoff else 1, BN if handoff else 1, DC],
                                        gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        stg_full = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        stg_free = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        for k in gl.static_range(STAGES):
            mbarrier.init(full.index(k), count=128)
            mbarrier.init(empty.index(k), count=2)
        for k in gl.static_range(NB):
            mbarrier.init(stg_full.index(k), count=1)
            mbarrier.init(stg_free.index(k), count=1)
        gl.warp_specialize([
            (_dq_consumer, (dq_ptr, idx_ptr, dkv_ptr, k_s, dsb_s, stg, full, empty, stg_full, stg_free, row, hb, h_q,
                            n_len, s_kv, limit, s_im, s_dkvr, s_dqr, s_dqh, sm_scale,
                            c, D0, DC, BH, BN, STAGES, NB, handoff, CAUSAL, DS_SCALED)),
            (_dkv_consumer, (q_ptr, do_ptr, idx_ptr, dkv_ptr, k_s, dsb_s, pb_s, qc_s, doc_s, stg, full, empty, stg_full,
                             stg_free, r, row, hb,
                             h_q, sm_scale, topk, n_len, n_hb, s_kv, limit, s_qm, s_qh, s_dor, s_doh, s_im, s_dkvr,
                             c, D0, DC, BH, BN, STAGES, HAS_V, CAUSAL, DETERMINISTIC, NB, DS_SCALED)),
            (_g_producer, (kv_ptr, idx_ptr, p_ptr, ds_ptr, k_s, dsb_s, pb_s, full, empty, r, row, hb, h_q, topk,
                           n_len, s_kv, limit, s_kvn, s_im, c, D0, DC, BH, BN, STAGES, HAS_V, CAUSAL)),
        ], [4, 4], [CONS_REGS, PROD_REGS])


def grads_ws_heads(h_q: int) -> int:
    """Heads a second-pass program takes: 128 (each kv row's reductions then carry 128 heads' worth) or 64."""
    return 128 if h_q > 64 else 64


@dataclass(frozen=True)
class GradsWsConfig(KernelConfig):
    """The second pass on sm_90. DC 128: twice the N of the Triton pass's wgmmas and half its P / dS re-reads; q, dO
    column blocks (64 KB), two slots (96 KB) and the fp32 staging of one dKV tile (32 KB) fill shared memory. The
    producer keeps 12 rows' addresses: 72 registers (40 spill; the rest of the 72 B stack is the shared prologue's,
    read once). DC 256 at 64 heads (q, dO blocks 64 KB, slots 96 KB, staging 64 KB: 229.7 KB) reads P / dS 5 instead
    of 9 times: 10.45 -> 10.08 ms. (The L2-bound reductions: consumer 1 hands them to consumer 0 instead of stalling
    its next wgmmas, 17.0 -> 15.7 ms at h_q 128, 11.3 -> 10.3 at 64 for the whole backward; a second staging buffer
    measured slower, 16.3 / 10.9; notes: sparse_mla_bwd.md.)"""
    DC: int = 128
    BN: int = 64
    STAGES: int = 2
    NB: int = 1
    CONS_REGS: int = 216
    PROD_REGS: int = 72


def grads_ws_launch(args, dout, p_buf, ds_buf, dq, target, row0: int, nr: int, bh: int, deterministic: bool,
                    ds_scaled: bool = True, config=None) -> None:
    """bwd._grads_kernel's work (both column parts) for rows [row0, row0 + nr) on sm_90; bh: 64 or 128 heads a
    program (the deterministic contributions are laid out by head block); ds_scaled: the scratch holds sm_scale dS
    (probs_ws_launch's scaled_ds)."""
    GradsWs(args, dout, dq, target, nr, bh, deterministic, ds_scaled, config, kept=False)(
        args, dout, p_buf, ds_buf, dq, target, row0)


class GradsWs:
    """grads_ws_launch's launches for nr rows, worked out once (kept: as ProbsWs)."""
    __slots__ = ("gos", "ints")

    def __init__(self, args, dout, dq, target, nr, bh, deterministic, ds_scaled=True, config=None, kept=True):
        q, kv, idx = args.q, args.kv, args.indices
        h_q, d_qk = q.shape[1:]
        cfg = GradsWsConfig.of(config, GradsWsConfig(DC=256 if bh == 64 else 128))
        n_hb = cdiv(h_q, bh)
        self.ints = (h_q, kv.shape[0], idx.shape[1], args.q_start_int, args.k_stride, n_hb, args.sm_scale,
                     q.stride(0), q.stride(1), kv.stride(0), dout.stride(0), dout.stride(1), idx.stride(0),
                     dq.stride(0), dq.stride(1), target.stride(0))
        go = Launch if kept else keyed
        self.gos = [go(_grads_ws_kernel, (n_c, nr, n_hb), D0=d0, DC=dcp, BH=bh, HAS_V=has_v,
                       DETERMINISTIC=deterministic, CAUSAL=args.causal, DS_SCALED=ds_scaled,
                       QS_TENSOR=args.q_start_t is not None, HAS_TLEN=args.topk_length is not None, num_warps=4,
                       **{k: v for k, v in cfg.items() if k != "DC"})
                    for d0, dcp, n_c, has_v in column_parts(args.d_v, d_qk, cfg.DC)]

    def __call__(self, args, dout, p_buf, ds_buf, dq, target, row0) -> None:
        self.run(args.q, args.kv, args.indices, args.topk_length, args.q_start_t, dout, p_buf, ds_buf, dq, target,
                 row0)

    def run(self, q, kv, idx, tlen, qs_t, dout, p_buf, ds_buf, dq, target, row0) -> None:
        tlen, qs_t = row_ptrs(idx, tlen, qs_t)
        head = (q, kv, dout, idx, qs_t, tlen, p_buf, ds_buf, dq, target, row0)
        for go in self.gos:
            go(*head, *self.ints)

    def direct(self) -> bool:
        return all(go.direct() for go in self.gos)
