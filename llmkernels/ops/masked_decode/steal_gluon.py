"""Masked decode for Hopper in Gluon, with work stealing: the programs of a (batch, kv head) row take its tiles
one at a time from a counter, so the SMs that stream faster take more tiles and the row's programs end together
(with equal static chunks, per-program times at B=1 range 63-92 us: benchmarks/notes/masked_decode.md, round 6).
Opt-in (masked_decode_fwd(..., config={"kernel": "steal"})): about 1 point above the interleaved Triton kernel at
B=1 dense, but 80 % when three 268 MB input sets are rotated after a 13 GB alloc/free (rounds 7-8).

A 4-warp producer grabs tile indices, reads each grab a tile later, loads the tile's mask a tile ahead and
cp.asyncs the kept K/V rows into a STAGES-deep shared-memory ring (dropped rows are never fetched); one consumer
warpgroup runs S^T = K q^T and O^T += V^T P^T on wgmma (tokens on M, the G heads on N) with an online softmax.
Each program writes one partial (out, lse) of its row and the shared merge combines them, as for the Triton kernel.
The counters live in a zeroed int32 buffer [2 * rows] (next tile, programs done); the row's last program to finish
resets both, so the buffer is zero again when the kernel ends.

Gluon has no interpreter: kernel.py is the portable path and what CPU tests cover; this one is tested on the GPU.
"""
import torch
import triton

from ..._gluon import (HAVE_GLUON, async_copy, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                       warpgroup_mma_wait)

if HAVE_GLUON:
    @gluon.jit
    def _lane0_add(ptr, val, sem: gl.constexpr):
        """Atomic add by thread 0 of the 4-warp producer; returns the per-thread result (read it with _lane0)."""
        lane_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        lane = gl.arange(0, 128, layout=lane_l)
        return gl.atomic_add(ptr + lane * 0, gl.full([128], val, gl.int32, lane_l), mask=lane == 0, sem=sem)

    @gluon.jit
    def _lane0(old):
        """Thread 0's value of _lane0_add, in every thread (a reduction: it waits for the atomic)."""
        lane = gl.arange(0, 128, layout=old.type.layout)
        return gl.max(gl.where(lane == 0, old, -2147483647), axis=0)

    @gluon.jit
    def _mask_load(m_row, s_ml, t, length, BLOCK_N: gl.constexpr, HAS_DROP: gl.constexpr, layout: gl.constexpr):
        """The drop flags of tile t (1 past the row's length), as loaded: read them with _keep a tile later."""
        offs = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
        if HAS_DROP:
            return gl.load(m_row + offs.to(gl.int64) * s_ml, mask=offs < length, other=1)
        return (offs >= length).to(gl.uint8)

    @gluon.jit
    def _keep(raw, t, length, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Tokens of tile t that are attended: inside the row's length and not dropped."""
        offs = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
        return (offs < length) & (raw == 0)

    @gluon.jit
    def _producer(k_row, v_row, m_row, ctr, k_s, v_s, meta_s, full, empty, length, n_tiles, n_prog, s_kl, s_vl,
                  s_ml, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, HAS_DROP: gl.constexpr):
        g_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16 B per cp.async
        n_l: gl.constexpr = gl.SliceLayout(1, g_l)
        d = gl.arange(0, D, layout=gl.SliceLayout(0, g_l))
        # latency hiding: a grab is read a tile after it is issued and a tile's mask loaded a tile ahead. Each
        # pending value is consumed before its register is reloaded: passing it along (t = t_next with t_next
        # still in flight) would make the register move wait for the load.
        t = _lane0(_lane0_add(ctr, 1, "relaxed"))
        grab = _lane0_add(ctr, 1, "relaxed")
        raw = _mask_load(m_row, s_ml, t, length, BLOCK_N, HAS_DROP, n_l)
        j = 0
        while t < n_tiles:  # grabs come back in order (one thread, one address): past the end, all later ones are
            keep = _keep(raw, t, length, BLOCK_N, n_l)
            t_next = _lane0(grab)
            grab = _lane0_add(ctr, 1, "relaxed")
            raw = _mask_load(m_row, s_ml, t_next, length, BLOCK_N, HAS_DROP, n_l)
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
            offs = (t * BLOCK_N + gl.arange(0, BLOCK_N, layout=n_l)).to(gl.int64)
            async_copy.async_copy_global_to_shared(k_s.index(s), k_row + offs[:, None] * s_kl + d[None, :],
                                                   mask=keep[:, None])
            async_copy.async_copy_global_to_shared(v_s.index(s), v_row + offs[:, None] * s_vl + d[None, :],
                                                   mask=keep[:, None])
            meta_s.index(s).store(keep.to(gl.int32))
            gl.thread_barrier()
            mbarrier.arrive(full.index(s), count=1)  # the keep flags (release)
            async_copy.mbarrier_arrive(full.index(s), increment_count=False)  # each thread, once its copies land
            t = t_next
            j += 1
        # a slot of -1 flags tells the consumer to stop
        s = j % STAGES
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
        meta_s.index(s).store(gl.full([BLOCK_N], -1, gl.int32, n_l))
        gl.thread_barrier()
        mbarrier.arrive(full.index(s), count=1)
        async_copy.mbarrier_arrive(full.index(s), increment_count=False)
        # every grab of this program is done (acq_rel orders them first); the row's last program resets the row
        fin = _lane0(_lane0_add(ctr + 1, 1, "acq_rel"))
        if fin == n_prog - 1:
            lane = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
            gl.store(ctr + lane, gl.zeros_like(lane), mask=lane < 2)

    @gluon.jit
    def _pv(v_s, s, p_s, acc, HALF: gl.constexpr):
        """acc^T[64 d, GN] += V[:, 64 * HALF:][tokens, 64]^T P^T[tokens, GN] (V^T read transposed from the ring)."""
        return warpgroup_mma(v_s.index(s).slice(64 * HALF, 64, dim=1).permute((1, 0)), p_s, acc, is_async=True)

    @gluon.jit
    def _store_half(o_ptr, acc, l_i, out_row0, split, s_or, s_os, G: gl.constexpr, GN: gl.constexpr,
                    HALF: gl.constexpr, st_l: gl.constexpr):
        d = 64 * HALF + gl.arange(0, 64, layout=gl.SliceLayout(1, st_l))
        g = gl.arange(0, GN, layout=gl.SliceLayout(0, st_l))
        o = acc / gl.where(l_i > 0, l_i, 1.0)[None, :]
        gl.store(o_ptr + (out_row0 + g)[None, :] * s_or + split * s_os + d[:, None], o, mask=(g < G)[None, :])

    @gluon.jit
    def _consumer(q_ptr, o_ptr, lse_ptr, q_s, p_s, k_s, v_s, meta_s, full, empty, q_row0, out_row0, split,
                  qk_scale, s_qh, s_or, s_os, s_lr, G: gl.constexpr, GN: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, STAGES: gl.constexpr):
        """Transposed products, so the tokens fill wgmma's 64-row M and the G heads its small N (GN >= 8):
        S^T = K q^T [BLOCK_N, GN] and O^T += V^T P^T [64, GN] per 64 columns of D (an 8x smaller product at
        G = 4 than padding the heads to 64 rows)."""
        st_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GN, 16])
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_g = gl.arange(0, GN, layout=gl.SliceLayout(1, ld_l))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        qv = gl.load(q_ptr + q_row0 + offs_g[:, None] * s_qh + offs_d[None, :], mask=(offs_g < G)[:, None], other=0.0)
        q_s.store(qv)  # heads >= G are zero: their columns are never stored
        fence_async_shared()
        gl.thread_barrier()  # every thread's part of q is stored before the warpgroup's wgmma reads it
        zero = gl.zeros([BLOCK_N, GN], gl.float32, st_l)
        m_i = gl.full([GN], float("-inf"), gl.float32, gl.SliceLayout(0, st_l))
        l_i = gl.zeros([GN], gl.float32, gl.SliceLayout(0, st_l))
        acc0 = gl.zeros([64, GN], gl.float32, st_l)
        acc1 = gl.zeros([64, GN], gl.float32, st_l)
        j = 0
        go = True
        while go:
            s = j % STAGES
            mbarrier.wait(full.index(s), (j // STAGES) & 1)
            keep = meta_s.index(s).load(gl.SliceLayout(1, st_l))
            go = gl.min(keep, axis=0) >= 0
            if go:
                fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
                st = warpgroup_mma(k_s.index(s), q_s.permute((1, 0)), zero, use_acc=False, is_async=True)
                st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
                st = gl.where((keep > 0)[:, None], st * qk_scale, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(st, axis=0))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # all dropped so far: avoid inf - inf
                p = gl.exp2(st - m_safe[None, :])
                alpha = gl.exp2(m_i - m_safe)
                l_i = l_i * alpha + gl.sum(p, axis=0)
                m_i = m_new
                p_s.store(p.to(k_s.dtype))
                fence_async_shared()
                gl.thread_barrier()
                acc0 = _pv(v_s, s, p_s, acc0 * alpha[None, :], 0)
                if D > 64:
                    acc1 = _pv(v_s, s, p_s, acc1 * alpha[None, :], 1)
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            gl.thread_barrier()  # the warpgroup is done reading slot s (and p_s)
            mbarrier.arrive(empty.index(s), count=1)
            j += 1
        _store_half(o_ptr, acc0, l_i, out_row0, split, s_or, s_os, G, GN, 0, st_l)
        if D > 64:
            _store_half(o_ptr, acc1, l_i, out_row0, split, s_or, s_os, G, GN, 1, st_l)
        lse = gl.where(l_i > 0, (m_i + gl.log2(l_i)) * 0.6931471805599453, float("-inf"))
        g = gl.arange(0, GN, layout=gl.SliceLayout(0, st_l))
        gl.store(lse_ptr + (out_row0 + g) * s_lr + split, lse, mask=g < G)

    @gluon.jit
    def _steal_kernel(q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr, ctr_ptr, Hkv, L, kv_len, qk_scale,
                      s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                      G: gl.constexpr, GN: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      HAS_DROP: gl.constexpr, HAS_LENS: gl.constexpr, USE_GDC: gl.constexpr,
                      PROD_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Grid (programs per row, B * Hkv)."""
        if USE_GDC:  # as combine.kernel.pdl_enter: the counters and inputs are read only after the wait
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                      pack=1)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        split = gl.program_id(0)
        n_prog = gl.num_programs(0)
        r = gl.program_id(1).to(gl.int64)
        b = r // Hkv
        h = r % Hkv
        if HAS_LENS:
            length = gl.minimum(gl.maximum(gl.load(lens_ptr + b), 0), L)
        else:
            length = kv_len
        n_tiles = gl.cdiv(length, BLOCK_N)
        dtype: gl.constexpr = k_ptr.dtype.element_ty
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], sl)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], sl)
        gl.static_assert(D == 64 or D == 128, "D 64 or 128")
        q_s = gl.allocate_shared_memory(dtype, [GN, D], gl.NVMMASharedLayout.get_default_for([GN, D], dtype))
        p_s = gl.allocate_shared_memory(dtype, [BLOCK_N, GN],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, GN], dtype))
        meta_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=129)  # the producer's flag arrival + its 128 threads' copies
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([
            (_consumer, (q_ptr, o_ptr, lse_ptr, q_s, p_s, k_s, v_s, meta_s, full, empty,
                         b * s_qb + h * G * s_qh, r * G, split, qk_scale, s_qh, s_or, s_os, s_lr, G, GN, BLOCK_N, D,
                         STAGES)),
            (_producer, (k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh, drop_ptr + b * s_mb + h * s_mh,
                         ctr_ptr + r * 2, k_s, v_s, meta_s, full, empty, length, n_tiles, n_prog, s_kl, s_vl,
                         s_ml, BLOCK_N, D, STAGES, HAS_DROP)),
        ], [4], [PROD_REGS])


def steal_launch(q, k, v, drop_mask, kv_lens, kv_len, qk_scale, o_part, lse_part, ctr, use_gdc, config):
    """Launch on grid (o_part.shape[1] programs per row, B * Hkv): q [B, Hq, D], k, v [B, Hkv, L, D] (unit last
    stride, rows 16-byte aligned); o_part [B * Hq, S, D], lse_part [B * Hq, S]; ctr int32 zeros [>= 2 * B * Hkv]."""
    B, Hq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    drop = drop_mask.view(torch.uint8) if drop_mask is not None else q
    ms = drop_mask.stride() if drop_mask is not None else (0, 0, 0)
    _steal_kernel[(o_part.shape[1], B * Hkv)](
        q, k, v, drop, kv_lens if kv_lens is not None else q, o_part, lse_part, ctr, Hkv, L, kv_len, qk_scale,
        q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], *ms,
        o_part.stride(0), o_part.stride(1), lse_part.stride(0),
        G=Hq // Hkv, GN=max(8, triton.next_power_of_2(Hq // Hkv)), D=D, HAS_DROP=drop_mask is not None,
        HAS_LENS=kv_lens is not None, USE_GDC=use_gdc, num_warps=4, **config, **({"launch_pdl": True} if use_gdc else {}))
