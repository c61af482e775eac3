"""One program per token: the row's softmax in registers, k rounds of (max, lowest index holding it, remove)."""
import triton
import triton.language as tl


@triton.jit
def _moe_topk_kernel(x_ptr, w_ptr, i_ptr, E, s_xt, s_xe, scale, K: tl.constexpr, K_PAD: tl.constexpr,
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
    vals = tl.where(bad, float("nan"), vals * scale)
    idxs = tl.where(bad, slots, idxs)
    tl.store(w_ptr + t * K + slots, vals, mask=slots < K)
    tl.store(i_ptr + t * K + slots, idxs.to(tl.int64), mask=slots < K)


@triton.jit
def _moe_topk_grouped_kernel(x_ptr, b_ptr, w_ptr, i_ptr, GS, s_xt, s_xe, scale, NG: tl.constexpr,
                             NG_PAD: tl.constexpr, GS_PAD: tl.constexpr, TOPK_GROUP: tl.constexpr, K: tl.constexpr,
                             K_PAD: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr):
    """DeepSeek-V3's routing, one program a token, the row as [groups, experts a group]: sigmoid scores, + bias for
    the choice, the TOPK_GROUP groups of largest top-2 sums kept, their K best experts; weights = the unbiased scores,
    / (sum + 1e-20) when RENORM, x scale. Ties go lowest index first; a NaN anywhere: NaN weights on 0 .. K-1."""
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, NG_PAD)
    j = tl.arange(0, GS_PAD)
    e = g[:, None] * GS + j[None, :]
    valid = (g[:, None] < NG) & (j[None, :] < GS)
    x = tl.load(x_ptr + t * s_xt + e * s_xe, mask=valid, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-x))
    c = s
    if HAS_BIAS:
        c = c + tl.load(b_ptr + e, mask=valid, other=0.0).to(tl.float32)
    bad = tl.sum(tl.sum((c != c).to(tl.int32), 1), 0) > 0
    c = tl.where(valid, c, float("-inf"))
    if NG > 1:  # group score: the sum of its two best; keep the TOPK_GROUP best groups
        m1 = tl.max(c, 1)
        j1 = tl.min(tl.where(c == m1[:, None], j[None, :], GS_PAD), 1)
        m2 = tl.max(tl.where(j[None, :] == j1[:, None], float("-inf"), c), 1)
        gq = tl.where(g < NG, m1 + m2, float("-inf"))
        keep = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            v = tl.max(gq, 0)
            gi = tl.min(tl.where((gq == v) & ~keep, g, NG_PAD), 0)
            keep = keep | (g == gi)
            gq = tl.where(g == gi, float("-inf"), gq)
        c = tl.where(keep[:, None], c, float("-inf"))
    slots = tl.arange(0, K_PAD)
    vals = tl.zeros([K_PAD], tl.float32)
    idxs = tl.zeros([K_PAD], tl.int32)
    BIG: tl.constexpr = NG_PAD * GS_PAD * 4
    taken = e < 0
    for k in tl.static_range(K):
        v = tl.max(tl.max(c, 1), 0)
        fi = tl.min(tl.min(tl.where((c == v) & ~taken, e, BIG), 1), 0)
        wv = tl.sum(tl.sum(tl.where((e == fi) & valid, s, 0.0), 1), 0)  # (a padded column aliases the next row)
        vals = tl.where(slots == k, wv, vals)
        idxs = tl.where(slots == k, fi, idxs)
        taken = taken | (e == fi)
        c = tl.where(e == fi, float("-inf"), c)
    if RENORM:
        vals = vals / (tl.sum(vals, 0) + 1e-20)
    vals = vals * scale
    vals = tl.where(bad, float("nan"), vals)
    idxs = tl.where(bad, slots, idxs)
    tl.store(w_ptr + t * K + slots, vals, mask=slots < K)
    tl.store(i_ptr + t * K + slots, idxs.to(tl.int64), mask=slots < K)
