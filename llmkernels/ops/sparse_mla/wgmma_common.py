"""Pieces shared by the sm_90 Gluon sparse MLA kernels (attn_dist_wgmma.py, fwd_wgmma.py, bwd_wgmma.py): where
they apply (wgmma_usable), the wgmma accumulator layout, a row's causal limit, index loads and checks, the packed
fp32 -> 16-bit conversion, and the q / kv shared memory of the forward and the backward's first pass."""
import torch
import triton

from ..._gluon import HAVE_GLUON, gl, gluon
from ..._runtime import capability, interpreting

if HAVE_GLUON:
    @triton.constexpr_function
    def mma_layout(n):
        """The wgmma accumulator layout of one warpgroup (4 warps) for a [64, n] tile."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride,
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
    def cvt2(x, dtype: gl.constexpr):
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
    def ws_idx(idx_ptr, row, t0, n_len, s_im, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Entries [t0, t0 + BLOCK_N) of the row, -1 past n_len. A consumer issues this load early and tests the
        values (ws_check) only after its next wait: testing them at once stalls the warpgroup on the load's L2
        round trip (~600-1000 clocks a tile; sparse_mla_fwd notes, version 5)."""
        offs = t0 + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_ptr + row * s_im + offs, mask=offs < n_len, other=-1)

    @gluon.jit
    def ws_check(idx, s_kv, limit, CAUSAL: gl.constexpr):
        """valid = in [0, s_kv) and visible (causal): one unsigned compare against min(s_kv, limit + 1) (negative
        indices wrap to >= 2^31), not three 64-bit ones; it sits on the consumers' softmax path."""
        bound = s_kv
        if CAUSAL:
            bound = gl.maximum(gl.minimum(limit + 1, s_kv), 0)
        return idx.to(gl.uint32, bitcast=True) < bound.to(gl.uint32)

    @gluon.jit
    def ws_valid(idx_ptr, row, t0, n_len, s_im, s_kv, limit, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                 layout: gl.constexpr):
        """(valid, indices) of entries [t0, t0 + BLOCK_N) of the row: -1 past n_len; valid = in [0, s_kv) and
        visible (causal)."""
        idx = ws_idx(idx_ptr, row, t0, n_len, s_im, BLOCK_N, layout)
        return ws_check(idx, s_kv, limit, CAUSAL), idx

    @gluon.jit
    def q_and_slots(dtype: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_T: gl.constexpr):
        """Shared memory of the forward and of the backward's first pass: two kv slots ([2, BLOCK_N, D_V] and the
        rope [2, BLOCK_N, 64], which takes a [64 heads, BLOCK_N] P once S is done) and q ([64, D_V], [64, D_T])."""
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        gl.static_assert(BLOCK_N == 64, "P [64 heads, BLOCK_N] takes the place of a slot's [BLOCK_N, 64] rope")
        klo_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, D_V], sl)
        khi_s = gl.allocate_shared_memory(dtype, [2, BLOCK_N, 64], sl)  # rope (d_qk 576), then P; P alone at 512
        qlo_s = gl.allocate_shared_memory(dtype, [64, D_V], sl)
        if D_T > 0:
            qhi_s = gl.allocate_shared_memory(dtype, [64, D_T], sl)
        else:
            qhi_s = qlo_s
        return klo_s, khi_s, qlo_s, qhi_s


def rows_16b(t: torch.Tensor, dims) -> bool:
    """Rows of t along dims provably 16-byte aligned for cp.async (16 B a thread): Triton marks an int argument
    divisible by 16 only when its value is (a stride of 5400 elements, 10800 B, is not), so ask that."""
    return t.data_ptr() % 16 == 0 and all(t.stride(d) % 16 == 0 for d in dims)


def wgmma_usable(a) -> bool:
    """True where the Gluon kernels apply: an sm_90 GPU, 16-byte aligned q / kv, strides multiples of 16 elements."""
    q, kv = a.q, a.kv
    if not HAVE_GLUON or interpreting() or q.device.type != "cuda":
        return False
    if capability(q.device) != (9, 0):
        return False
    return rows_16b(q, (0, 1)) and rows_16b(kv, (0,))
