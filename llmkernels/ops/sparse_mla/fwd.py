"""Sparse MLA forward (Triton): one program per (query row, block of heads), gathering the row's topk kv rows."""
import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._runtime import cdiv, interpreting, next_pow2
from ..combine.kernel import softmax_step
from .common import LN2_C, TileConfig, nan_max, row_args, row_finish, row_flags, sink_arg
from .fwd_wgmma import sparse_mla_fwd_ws_launch
from .wgmma_common import wgmma_usable


@triton.jit
def row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride,
               HAS_TLEN: tl.constexpr, CAUSAL: tl.constexpr, QS_TENSOR: tl.constexpr):
    """(entries of the row to scan, highest visible kv index) for row (int64): the Triton forward, attn_dist, bwd."""
    n_len = topk
    if HAS_TLEN:
        n_len = tl.minimum(tl.maximum(tl.load(tlen_ptr + row), 0), topk)
    limit = 2147483647
    if CAUSAL:
        if QS_TENSOR:
            num = row + tl.load(qs_ptr) + 1 - k_stride  # row is int64, so is num
        else:
            num = row + q_start + 1 - k_stride
        # floor division: num >= -(k_stride - 1) here, and any negative num means nothing is visible yet
        limit = tl.where(num >= 0, num // k_stride, -1)
    return n_len, limit


@triton.jit
def load_idx(idx_ptr, row, n0, n_len, s_im, BLOCK_N: tl.constexpr):
    offs = n0 + tl.arange(0, BLOCK_N)
    return tl.load(idx_ptr + row * s_im + offs, mask=offs < n_len, other=-1)


@triton.jit
def load_q(q_ptr, row, offs_h, hmask, s_qm, s_qh, D_V: tl.constexpr, D_T: tl.constexpr):
    """q[row, offs_h] as (q[:, :D_V], the rope q[:, D_V:]; q_lo again when there is no rope), padded heads 0."""
    q_rows = q_ptr + row * s_qm + offs_h[:, None].to(tl.int64) * s_qh
    q_lo = tl.load(q_rows + tl.arange(0, D_V)[None, :], mask=hmask[:, None], other=0.0)
    q_hi = q_lo
    if D_T > 0:
        q_hi = tl.load(q_rows + D_V + tl.arange(0, D_T)[None, :], mask=hmask[:, None], other=0.0)
    return q_lo, q_hi


@triton.jit
def tile_idx(idx_ptr, row, n0, idx_n, n_len, s_im, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    """(indices of the tile at n0, carried value): with PREFETCH the next tile's indices are loaded one tile ahead
    (idx_n carries them), so the next gather need not wait for them."""
    if PREFETCH:
        idx = idx_n
        idx_n = load_idx(idx_ptr, row, n0 + BLOCK_N, n_len, s_im, BLOCK_N)
    else:
        idx = load_idx(idx_ptr, row, n0, n_len, s_im, BLOCK_N)
    return idx, idx_n


@triton.jit
def logits(q_lo, q_hi, k_lo, k_hi, D_T: tl.constexpr):
    """q k^T over d_qk, as a product over the first D_V dims plus one over the rope."""
    s = tl.dot(q_lo, tl.trans(k_lo))
    if D_T > 0:
        s = tl.dot(q_hi, tl.trans(k_hi), s)
    return s


@triton.jit
def gather(kv_ptr, idx, s_kv, limit, s_kvn, D_V: tl.constexpr, D_T: tl.constexpr, CAUSAL: tl.constexpr):
    """Gather the kv rows idx lists: (valid, kv[:, :D_V], kv[:, D_V:D_V + D_T]); invalid rows are never read."""
    valid = (idx >= 0) & (idx < s_kv)
    if CAUSAL:
        valid = valid & (idx <= limit)
    base = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * s_kvn
    k_lo = tl.load(base[:, None] + tl.arange(0, D_V)[None, :], mask=valid[:, None], other=0.0)
    if D_T > 0:
        k_hi = tl.load(base[:, None] + D_V + tl.arange(0, D_T)[None, :], mask=valid[:, None], other=0.0)
    else:
        k_hi = k_lo
    return valid, k_lo, k_hi


@triton.jit
def _fwd_kernel(q_ptr, kv_ptr, idx_ptr, out_ptr, maxl_ptr, lse_ptr, sink_ptr, tlen_ptr, qs_ptr,
                s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride,
                s_qm, s_qh, s_kvn, s_im, s_om, s_oh, s_lm,
                BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_V: tl.constexpr, D_T: tl.constexpr,
                HAS_SINK: tl.constexpr, HAS_TLEN: tl.constexpr, CAUSAL: tl.constexpr,
                QS_TENSOR: tl.constexpr, SINK_IN_LSE: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // n_hb).to(tl.int64)  # head blocks of one row run side by side: they share its gathers in L2
    hb = pid % n_hb
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < h_q
    q_lo, q_hi = load_q(q_ptr, row, offs_h, hmask, s_qm, s_qh, D_V, D_T)
    n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the log2-scaled logits
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    idx_n = load_idx(idx_ptr, row, 0, n_len, s_im, BLOCK_N)
    for n0 in range(0, n_len, BLOCK_N):
        idx, idx_n = tile_idx(idx_ptr, row, n0, idx_n, n_len, s_im, BLOCK_N, PREFETCH)
        valid, k_lo, k_hi = gather(kv_ptr, idx, s_kv, limit, s_kvn, D_V, D_T, CAUSAL)
        s = logits(q_lo, q_hi, k_lo, k_hi, D_T)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_lo.dtype), k_lo)  # V is the first D_V dims of the same tile

    empty, lse2, denom = row_finish(m_i, l_i, sink_ptr, offs_h, hmask, HAS_SINK, SINK_IN_LSE)
    o = acc / denom[:, None]
    o = tl.where(empty[:, None], 0.0, o)
    lse = tl.where(empty, float("inf"), lse2 * LN2_C)
    offs_d = tl.arange(0, D_V)
    tl.store(out_ptr + row * s_om + offs_h[:, None].to(tl.int64) * s_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=hmask[:, None])
    tl.store(maxl_ptr + row * s_lm + offs_h, nan_max(m_i, l_i) * LN2_C, mask=hmask)
    tl.store(lse_ptr + row * s_lm + offs_h, lse, mask=hmask)


def fwd_config(h_q: int, topk: int, device: torch.device) -> TileConfig:
    """Block sizes, warps and pipeline depth (tuned on an H100 for d_qk 576, see benchmarks/notes).

    Index prefetch (PREFETCH) makes the forward slower there (the pipeliner then keeps more live
    registers and spills at BLOCK_N 64), so it is off on the GPU.
    """
    if interpreting() or device.type != "cuda":
        return TileConfig(BLOCK_H=max(16, next_pow2(min(h_q, 64))),
                          BLOCK_N=max(16, min(32, next_pow2(topk))), num_warps=4, num_stages=1,
                          PREFETCH=True)
    if h_q > 32:
        return TileConfig(BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=2, PREFETCH=False)
    return TileConfig(BLOCK_H=max(16, next_pow2(h_q)), BLOCK_N=64, num_warps=4, num_stages=2, PREFETCH=False)


def sparse_mla_fwd_launch(a, out, max_logits, lse, sink_in_lse: bool = True, config=None) -> None:
    """a: common.SparseArgs. Writes out [s_q, h_q, d_v], max_logits and lse [s_q, h_q] (lse natural log).

    sink_in_lse: lse includes exp(attn_sink) (this library's convention) or not (FlashMLA's).
    """
    q, kv, idx = a.q, a.kv, a.indices
    s_q, h_q, d_qk = q.shape
    topk = idx.shape[1]
    if s_q == 0 or h_q == 0:
        return
    # Hopper: the warp-specialised Gluon kernel (fwd_wgmma.py), at every h_q (it pads to 64 heads, and still beats
    # the Triton kernel at h_q 16: 144 vs 102 TFLOP/s; benchmarks/notes/sparse_mla_fwd.md)
    if config is None and wgmma_usable(a):
        sparse_mla_fwd_ws_launch(a, out, max_logits, lse, sink_in_lse=sink_in_lse)
        return
    cfg = TileConfig.of(config) if config else fwd_config(h_q, topk, q.device)
    bh = cfg.BLOCK_H
    n_hb = cdiv(h_q, bh)
    launch(_fwd_kernel, (s_q * n_hb,),
        q, kv, idx, out, max_logits, lse, sink_arg(a), *row_args(a, n_hb),
        q.stride(0), q.stride(1), kv.stride(0), idx.stride(0), out.stride(0), out.stride(1), lse.stride(0),
        BLOCK_H=bh, D_V=a.d_v, D_T=d_qk - a.d_v, HAS_SINK=a.attn_sink is not None, SINK_IN_LSE=sink_in_lse,
        **row_flags(a), **cfg.kernel_kwargs())
