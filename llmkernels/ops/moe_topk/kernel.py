"""One program per token: the row's softmax in registers, k rounds of (max, lowest index holding it, remove)."""
import triton
import triton.language as tl


@triton.jit
def _moe_topk_kernel(x_ptr, w_ptr, i_ptr, E, s_xt, s_xe, K: tl.constexpr, K_PAD: tl.constexpr,
                     BLOCK_E: tl.constexpr, RENORM: tl.constexpr):
    """Weights fp32 / indices int64 [T, K] contiguous. Equal probabilities go lowest index first; a row whose softmax
    holds a NaN (a NaN or +inf logit) gets NaN weights on experts 0 .. K-1, so the NaN reaches the layer's output."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    valid = offs < E
    x = tl.load(x_ptr + t * s_xt + offs * s_xe, mask=valid, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(valid, p, 0.0)
    p = p / tl.sum(p, 0)
    bad = tl.sum((p != p).to(tl.int32), 0) > 0
    slots = tl.arange(0, K_PAD)
    vals = tl.zeros([K_PAD], tl.float32)
    idxs = tl.zeros([K_PAD], tl.int32)
    q = tl.where(valid, p, -1.0)  # probabilities are >= 0: -1 never wins, -2 marks a taken expert
    for j in tl.static_range(K):
        v = tl.max(q, 0)
        i = tl.min(tl.where(q == v, offs, BLOCK_E), 0)
        vals = tl.where(slots == j, v, vals)
        idxs = tl.where(slots == j, i, idxs)
        q = tl.where(offs == i, -2.0, q)
    if RENORM:
        vals = vals / tl.sum(vals, 0)  # padded slots hold 0
    vals = tl.where(bad, float("nan"), vals)
    idxs = tl.where(bad, slots, idxs)
    tl.store(w_ptr + t * K + slots, vals, mask=slots < K)
    tl.store(i_ptr + t * K + slots, idxs.to(tl.int64), mask=slots < K)
