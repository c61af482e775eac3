"""Attention distribution over the selected tokens, summed over heads: [s_q, topk], never [s_q, h_q, topk]."""
import torch
import triton
import triton.language as tl

from ..._launch import launch
from ..._runtime import cdiv, interpreting, next_pow2
from .attn_dist_wgmma import attn_dist_ws_launch
from .wgmma_common import wgmma_usable
from .common import LOG2E_C, TileConfig, row_args, row_flags
from .fwd import gather, load_idx, load_q, logits, row_limits, tile_idx


@triton.jit
def _dist_kernel(q_ptr, kv_ptr, idx_ptr, lse_ptr, out_ptr, tlen_ptr, qs_ptr,
                 s_kv, h_q, topk, n_hb, qk_scale, q_start, k_stride,
                 s_qm, s_qh, s_kvn, s_im, s_lm, s_lh, s_om,
                 BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_V: tl.constexpr, D_T: tl.constexpr,
                 HAS_TLEN: tl.constexpr, CAUSAL: tl.constexpr, QS_TENSOR: tl.constexpr, ATOMIC: tl.constexpr,
                 PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // n_hb).to(tl.int64)
    hb = pid % n_hb
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < h_q
    q_lo, q_hi = load_q(q_ptr, row, offs_h, hmask, s_qm, s_qh, D_V, D_T)
    # padded heads get lse = +inf, so their probabilities are exactly 0
    lse2 = tl.load(lse_ptr + row * s_lm + offs_h * s_lh, mask=hmask, other=float("inf")) * LOG2E_C
    n_len, limit = row_limits(row, topk, tlen_ptr, qs_ptr, q_start, k_stride, HAS_TLEN, CAUSAL, QS_TENSOR)
    idx_n = load_idx(idx_ptr, row, 0, n_len, s_im, BLOCK_N)
    for n0 in range(0, n_len, BLOCK_N):
        idx, idx_n = tile_idx(idx_ptr, row, n0, idx_n, n_len, s_im, BLOCK_N, PREFETCH)
        valid, k_lo, k_hi = gather(kv_ptr, idx, s_kv, limit, s_kvn, D_V, D_T, CAUSAL)
        s = logits(q_lo, q_hi, k_lo, k_hi, D_T)
        p = tl.exp2(s * qk_scale - lse2[:, None])
        col = tl.sum(tl.where(valid[None, :], p, 0.0), axis=0)  # invalid entries stay exactly 0
        offs = n0 + tl.arange(0, BLOCK_N)
        if ATOMIC:
            tl.atomic_add(out_ptr + row * s_om + offs, col, mask=offs < n_len, sem="relaxed")
        else:
            tl.store(out_ptr + row * s_om + offs, col, mask=offs < n_len)


def dist_config(h_q: int, topk: int, device: torch.device) -> TileConfig:
    if interpreting() or device.type != "cuda":
        return TileConfig(BLOCK_H=max(16, next_pow2(min(h_q, 64))),
                          BLOCK_N=max(16, min(32, next_pow2(topk))), num_warps=4, num_stages=1,
                          PREFETCH=True)
    # measured on an H100 at s_q 4096, topk 2048 (benchmarks/notes/sparse_mla_fwd.md)
    if h_q > 64:  # all 128 heads in one program: each gathered tile serves twice the math (L2 traffic halves)
        return TileConfig(BLOCK_H=128, BLOCK_N=32, num_warps=8, num_stages=2, PREFETCH=True)
    return TileConfig(BLOCK_H=64 if h_q > 32 else max(16, next_pow2(h_q)), BLOCK_N=64, num_warps=4,
                      num_stages=2, PREFETCH=True)


def attn_dist_launch(a, lse, out, config=None) -> None:
    """a: common.SparseArgs; lse [s_q, h_q] fp32 (natural log); out [s_q, topk] fp32, must be zero-filled.

    Entries at or past a row's topk_length are left untouched (zero). Over several head blocks the partial
    sums are added atomically: 0 + a + b is exact in either order, so up to 2 blocks (h_q <= 256 on the GPU) the result
    is deterministic; beyond that the order of additions (last bits) may vary between runs.
    """
    q, kv, idx = a.q, a.kv, a.indices
    s_q, h_q, d_qk = q.shape
    topk = idx.shape[1]
    if s_q == 0 or h_q == 0:
        return
    # Hopper: the warp-specialised Gluon kernel (attn_dist_wgmma.py); above 128 heads it would add 4+ partial
    # sums per entry atomically (order-dependent bits), so those shapes keep the deterministic Triton kernel
    if config is None and h_q <= 128 and wgmma_usable(a):
        attn_dist_ws_launch(a, lse, out)
        return
    cfg = TileConfig.of(config) if config else dist_config(h_q, topk, q.device)
    bh = cfg.BLOCK_H
    n_hb = cdiv(h_q, bh)
    launch(_dist_kernel, (s_q * n_hb,),
        q, kv, idx, lse, out, *row_args(a, n_hb),
        q.stride(0), q.stride(1), kv.stride(0), idx.stride(0), lse.stride(0), lse.stride(1), out.stride(0),
        BLOCK_H=bh, D_V=a.d_v, D_T=d_qk - a.d_v, ATOMIC=n_hb > 1, **row_flags(a), **cfg.kernel_kwargs())
