"""NVFP4 GEMV for Hopper in Gluon: persistent programs stream their weight tiles through a cp.async ring in
shared memory, so loads of the next tiles are in flight while the current one is decoded, and (with
static_weights, under programmatic dependent launch) the ring is filled before griddepcontrol.wait.

Same arithmetic as kernel.py's asm path (prmt lookups, dp4a block sums, fp32 scaling and accumulation in the
same per-thread order), so results are bit-identical to it. Experimental, opt-in (cfg {"kernel": "gluon"}).
Gluon has no interpreter: kernel.py is the portable path and what CPU tests cover; this one is tested on the GPU.
"""
import torch
import triton

from ..._gluon import HAVE_GLUON, async_copy, gl, gluon
from ..._runtime import interpreting, num_sms
from .kernel import _asm_a, _asm_b

if HAVE_GLUON:
    _ASM_A = gl.constexpr(_asm_a())
    _ASM_B = gl.constexpr(_asm_b())

    @gluon.jit
    def _gdc(asm: gl.constexpr):
        gl.inline_asm_elementwise(asm + " // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _issue(a_ptr, sa_ptr, a_s, sa_s, slot, valid, l, m0, kt, M, KB, s_al, s_am, s_sal, s_sam,
               BM: gl.constexpr, BKB: gl.constexpr, a_l: gl.constexpr, s_l: gl.constexpr):
        """cp.async the tile (batch l, rows m0.., K tile kt) into ring slot `slot`; one commit group per tile, empty
        when not valid, so wait_group counts stay uniform."""
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, a_l))
        cols = kt * BKB + gl.arange(0, BKB, layout=gl.SliceLayout(0, a_l))
        ok = ((rows < M)[:, None] & (cols < KB)[None, :]) & valid
        async_copy.async_copy_global_to_shared(
            a_s.index(slot), a_ptr + l * s_al + rows[:, None].to(gl.int64) * s_am + cols[None, :], mask=ok)
        rows_s = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_l))
        cols_s = kt * BKB + gl.arange(0, BKB, layout=gl.SliceLayout(0, s_l))
        ok_s = ((rows_s < M)[:, None] & (cols_s < KB)[None, :]) & valid
        async_copy.async_copy_global_to_shared(
            sa_s.index(slot), sa_ptr + l * s_sal + rows_s[:, None].to(gl.int64) * s_sam + cols_s[None, :], mask=ok_s)
        async_copy.commit_group()

    @gluon.jit
    def _advance(l, m0, kt, NK, M, BM: gl.constexpr):
        """The next tile in a program's order (K tiles of a row group, then the next group, then the next batch),
        without divisions."""
        kt += 1
        if kt == NK:
            kt = 0
            m0 += BM
            if m0 >= M:
                m0 = 0
                l += 1
        return l, m0, kt

    @gluon.jit
    def _gemv_ring_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, alpha,
                          M, KB, n_groups, per_prog, gpl, s_al, s_am, s_sal, s_sam, s_bl, s_sbl, s_om, s_ol,
                          BM: gl.constexpr, BKB: gl.constexpr, STAGES: gl.constexpr,
                          USE_GDC: gl.constexpr, STATIC: gl.constexpr):
        """Program p owns row groups [p * per_prog, ...) (BM rows of one batch l each) x all K tiles of BKB blocks.
        a_ptr int64 blocks [L, M, KB] (strides s_al, s_am, 1); sa_ptr uint8 [L, M, KB] (s_sal, s_sam, 1);
        b_ptr int64 [L, KB] (s_bl, 1); sb_ptr uint8 [L, KB] (s_sbl, 1); out[m * s_om + l * s_ol] fp16."""
        gl.static_assert(BKB == 128, "a warp spans 128 blocks along K, 4 per thread")
        # every thread copies exactly the bytes it later reads (4 blocks = 32 bytes of a, 4 bytes of scales, per
        # row), so its own wait_group is all the synchronisation the ring needs: no CTA barrier, warps run free
        a_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        s_l: gl.constexpr = a_l
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        a_s = gl.allocate_shared_memory(gl.int64, [STAGES, BM, BKB], flat)
        sa_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BM, BKB], flat)
        if USE_GDC:
            if STATIC:  # weights are never written by a kernel still running: the next call may start at once
                _gdc("griddepcontrol.launch_dependents;")
            else:
                _gdc("griddepcontrol.wait;")
        NK = gl.cdiv(KB, BKB)
        g0 = gl.program_id(0) * per_prog
        n_items = (gl.minimum(g0 + per_prog, n_groups) - g0) * NK
        l = g0 // gpl  # consumer position
        m0 = (g0 % gpl) * BM
        kt = 0
        il = l  # producer position, STAGES - 1 tiles ahead
        im0 = m0
        ikt = 0
        for j in gl.static_range(STAGES - 1):
            _issue(a_ptr, sa_ptr, a_s, sa_s, j, j < n_items, il.to(gl.int64), im0, ikt, M, KB, s_al, s_am, s_sal,
                   s_sam, BM, BKB, a_l, s_l)
            il, im0, ikt = _advance(il, im0, ikt, NK, M, BM)
        if USE_GDC:
            if STATIC:  # activations and the output only after the preceding kernel is done
                _gdc("griddepcontrol.wait;")
            else:
                _gdc("griddepcontrol.launch_dependents;")
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, a_l))
        offs_k = gl.arange(0, BKB, layout=gl.SliceLayout(0, a_l))
        acc = gl.zeros([BM, BKB], gl.float32, a_l)
        slot = 0
        islot = STAGES - 1
        for j in range(n_items):
            async_copy.wait_group(STAGES - 2)  # this thread's copies of tile j have landed
            _issue(a_ptr, sa_ptr, a_s, sa_s, islot, j + STAGES - 1 < n_items, il.to(gl.int64), im0, ikt, M, KB,
                   s_al, s_am, s_sal, s_sam, BM, BKB, a_l, s_l)
            il, im0, ikt = _advance(il, im0, ikt, NK, M, BM)
            islot = gl.where(islot == STAGES - 1, 0, islot + 1)
            a = a_s.index(slot).load(a_l)
            sa = sa_s.index(slot).load(a_l)
            slot = gl.where(slot == STAGES - 1, 0, slot + 1)
            l64 = l.to(gl.int64)
            cols = kt * BKB + offs_k
            b = gl.load(b_ptr + l64 * s_bl + cols, mask=cols < KB, other=0)[None, :]
            sb = gl.load(sb_ptr + l64 * s_sbl + cols, mask=cols < KB, other=0)[None, :]
            b0, b1, b2, b3, n0, n1, n2, n3 = gl.inline_asm_elementwise(
                _ASM_B, "=r,=r,=r,=r,=r,=r,=r,=r,l", [b],
                dtype=(gl.int32, gl.int32, gl.int32, gl.int32, gl.int32, gl.int32, gl.int32, gl.int32),
                is_pure=True, pack=1)
            dot = gl.inline_asm_elementwise(_ASM_A, "=r,l,r,r,r,r,r,r,r,r", [a, b0, b1, b2, b3, n0, n1, n2, n3],
                                            dtype=gl.int32, is_pure=True, pack=1)
            scale = sa.to(gl.float8e4nv, bitcast=True).to(gl.float32) * (
                sb.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 0.25)
            acc += dot.to(gl.float32) * scale
            if kt == NK - 1:
                rows = m0 + offs_m
                total = gl.sum(acc, axis=1)
                gl.store(out_ptr + rows * s_om + l64 * s_ol, (total * alpha).to(gl.float16), mask=rows < M)
                acc = gl.zeros([BM, BKB], gl.float32, a_l)
            l, m0, kt = _advance(l, m0, kt, NK, M, BM)
        async_copy.wait_group(0)


RING_CONFIG = {"BM": 8, "BKB": 128, "STAGES": 4, "num_warps": 4, "ctas_per_sm": 4}


def ring_usable(a64, sa8, sb8) -> bool:
    """sm_90 with Gluon; scales unit-stride along K with 16-divisible row and batch strides and a 16-byte aligned
    base (Triton proves the 4-byte cp.async alignment only from 16-divisibility): K % 256 == 0 in the contest
    layout."""
    if not HAVE_GLUON or interpreting() or a64.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(a64.device) != (9, 0):
        return False
    return (sa8.stride(1) == 1 and sa8.stride(0) % 16 == 0 and sa8.stride(2) % 16 == 0 and sa8.data_ptr() % 16 == 0
            and a64.stride(2) == 1 and a64.data_ptr() % 16 == 0 and sb8.stride(0) == 1)


def ring_launch(a64, sa8, b64, sb8, out, alpha: float, pdl: bool, static: bool, cfg: dict):
    """a64 int64 [L, M, KB]; sa8 uint8 [M, KB, L]; b64 int64 [L, KB]; sb8 uint8 [KB, L]; out fp16 [M, 1, L]."""
    L, M, KB = a64.shape
    c = {**RING_CONFIG, **{k: v for k, v in cfg.items() if k in RING_CONFIG}}
    gpl = triton.cdiv(M, c["BM"])
    n_groups = gpl * L
    slots = c["ctas_per_sm"] * num_sms(a64.device)
    per = triton.cdiv(n_groups, slots)  # equal work: fewer programs than slots rather than a short last one
    grid = (triton.cdiv(n_groups, per),)
    _gemv_ring_kernel[grid](
        a64, sa8, b64, sb8, out, alpha, M, KB, n_groups, per, gpl,
        a64.stride(0), a64.stride(1), sa8.stride(2), sa8.stride(0), b64.stride(0), sb8.stride(1),
        out.stride(0), out.stride(2),
        BM=c["BM"], BKB=c["BKB"], STAGES=c["STAGES"], USE_GDC=pdl, STATIC=static,
        num_warps=c["num_warps"], **({"launch_pdl": True} if pdl else {}))
    return out
