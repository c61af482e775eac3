"""The DSA indexer's scores in one pass: for a tile of queries and all their heads (rows = queries x heads), tensor-core
dots against blocks of keys, ReLU, the per-head weights, the sum over heads; key blocks past the tile's last position
are never read (written -inf)."""
import triton
import triton.language as tl


@triton.jit
def _index_scores_kernel(q_ptr, k_ptr, w_ptr, pos_ptr, out_ptr, S, H, key_start, n_keys, scale,
                         sq_b, sq_s, sq_h, sk_b, sk_t, sw_b, sw_s, sp_b, so_b, so_s,
                         HAS_POS: tl.constexpr, BM: tl.constexpr, HP: tl.constexpr, D: tl.constexpr,
                         BN: tl.constexpr, NB: tl.constexpr):
    pid_s, pid_t, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BM * HP)
    s_row, h_row = pid_s * BM + rows // HP, rows % HP
    row_ok = (s_row < S) & (h_row < H)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + s_row[:, None] * sq_s + h_row[:, None] * sq_h + d[None, :],
                mask=row_ok[:, None], other=0.0)
    w = tl.load(w_ptr + b * sw_b + s_row * sw_s + h_row, mask=row_ok, other=0.0) * scale  # relu(x) * s = relu(x * s)
    qs = pid_s * BM + tl.arange(0, BM)
    live = NB  # key blocks of this program some query of the tile sees; the rest are written -inf unread
    if HAS_POS:
        pos = tl.load(pos_ptr + b * sp_b + qs, mask=qs < S, other=-1)
        first = key_start + pid_t * NB * BN
        live = tl.minimum(NB, tl.maximum(0, tl.cdiv(tl.max(pos, 0) + 1 - first, BN)))
    for j in range(0, live):  # a plain loop (no branch inside): the loads pipeline
        t = (pid_t * NB + j) * BN + tl.arange(0, BN)  # relative to key_start
        t_ok = t < n_keys
        k = tl.load(k_ptr + b * sk_b + (key_start + t)[:, None] * sk_t + d[None, :], mask=t_ok[:, None], other=0.0)
        acc = tl.dot(q, tl.trans(k))  # [BM * HP, BN] fp32
        acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[:, None]  # NaN stays NaN
        sc = tl.sum(tl.reshape(acc, [BM, HP, BN]), axis=1)
        if HAS_POS:
            sc = tl.where((key_start + t)[None, :] <= pos[:, None], sc, float("-inf"))
        tl.store(out_ptr + b * so_b + qs[:, None] * so_s + t[None, :], sc, mask=(qs < S)[:, None] & t_ok[None, :])
    for j in range(live, NB):
        t = (pid_t * NB + j) * BN + tl.arange(0, BN)
        tl.store(out_ptr + b * so_b + qs[:, None] * so_s + t[None, :], tl.full([BM, BN], float("-inf"), tl.float32),
                 mask=(qs < S)[:, None] & (t < n_keys)[None, :])


def launch(q, k, w, pos, out, scale, key_start, n_keys, sms):
    """out [B, S, n_keys] fp32 <- the scores of keys key_start..key_start + n_keys (see the module's doc)."""
    B, S, H, D = q.shape
    HP = triton.next_power_of_2(H)
    BM = max(1, min(128 // HP if HP <= 128 else 1, triton.next_power_of_2(S)))
    BM = max(BM, -(-16 // HP))  # a dot needs 16 rows
    BN = 128 if BM * HP <= 128 else 64
    blocks = triton.cdiv(n_keys, BN)
    tiles = triton.cdiv(S, BM) * B
    NB = max(1, min(8, blocks * tiles // (4 * sms)))  # key blocks a program: enough programs for 4 waves
    grid = (triton.cdiv(S, BM), triton.cdiv(blocks, NB), B)
    has_pos = pos is not None
    _index_scores_kernel[grid](
        q, k, w, pos if has_pos else w, out, S, H, key_start, n_keys, scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), w.stride(0), w.stride(1),
        pos.stride(0) if has_pos else 0, out.stride(0), out.stride(1),
        HAS_POS=has_pos, BM=BM, HP=HP, D=D, BN=BN, NB=NB, num_warps=8 if BM * HP >= 128 else 4, num_stages=2)


@triton.jit
def _topk_logits_fwd(q_ptr, k_ptr, w_ptr, idx_ptr, out_ptr, H, T, K, scale, sq_b, sq_s, sq_h, sk_b, sk_t,
                     sw_b, sw_s, si_b, si_s, so_b, so_s, HP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr):
    """One query (all heads) against its selected keys: logits[j] = sum_h w_h relu(scale q_h . k[idx_j]), 0 where
    idx_j is not a key."""
    s, b = tl.program_id(0), tl.program_id(1)
    h, d = tl.arange(0, HP), tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + s * sq_s + h[:, None] * sq_h + d[None, :], mask=(h < H)[:, None], other=0.0)
    w = tl.load(w_ptr + b * sw_b + s * sw_s + h, mask=h < H, other=0.0) * scale
    for j0 in range(0, K, BN):
        j = j0 + tl.arange(0, BN)
        t = tl.load(idx_ptr + b * si_b + s * si_s + j, mask=j < K, other=-1)
        ok = (t >= 0) & (t < T)
        kk = tl.load(k_ptr + b * sk_b + t[:, None] * sk_t + d[None, :], mask=ok[:, None], other=0.0)
        acc = tl.maximum(tl.dot(q, tl.trans(kk)), 0.0, propagate_nan=tl.PropagateNan.ALL) * w[:, None]
        tl.store(out_ptr + b * so_b + s * so_s + j, tl.where(ok, tl.sum(acc, 0), 0.0), mask=j < K)


@triton.jit
def _topk_logits_bwd(q_ptr, k_ptr, w_ptr, idx_ptr, g_ptr, dq_ptr, dk_ptr, dw_ptr, H, T, K, scale, sq_b, sq_s, sq_h,
                     sk_b, sk_t, sw_b, sw_s, si_b, si_s, sg_b, sg_s, HP: tl.constexpr, D: tl.constexpr,
                     BN: tl.constexpr):
    """The gradients of _topk_logits_fwd for one query: dq and dw stored, dk atomically added (fp32 [B, T, D])."""
    s, b = tl.program_id(0), tl.program_id(1)
    h, d = tl.arange(0, HP), tl.arange(0, D)
    hok = h < H
    q = tl.load(q_ptr + b * sq_b + s * sq_s + h[:, None] * sq_h + d[None, :], mask=hok[:, None], other=0.0)
    w = tl.load(w_ptr + b * sw_b + s * sw_s + h, mask=hok, other=0.0) * scale
    dq = tl.zeros([HP, D], tl.float32)
    dw = tl.zeros([HP], tl.float32)
    for j0 in range(0, K, BN):
        j = j0 + tl.arange(0, BN)
        t = tl.load(idx_ptr + b * si_b + s * si_s + j, mask=j < K, other=-1)
        ok = (t >= 0) & (t < T)
        kk = tl.load(k_ptr + b * sk_b + t[:, None] * sk_t + d[None, :], mask=ok[:, None], other=0.0)
        g = tl.load(g_ptr + b * sg_b + s * sg_s + j, mask=ok, other=0.0)
        pre = tl.dot(q, tl.trans(kk))  # [HP, BN]
        live = pre > 0
        dw += tl.sum(tl.where(live, pre, 0.0) * g[None, :], 1)
        dpre = tl.where(live, g[None, :] * w[:, None], 0.0).to(q.dtype)  # bf16 / fp16 operands, fp32 sums
        dq += tl.dot(dpre, kk)
        dkk = tl.dot(tl.trans(dpre), q)  # [BN, D]
        tl.atomic_add(dk_ptr + (b * T + t[:, None]) * D + d[None, :], dkk, mask=ok[:, None], sem="relaxed")
    tl.store(dq_ptr + ((b * tl.num_programs(0) + s) * H + h[:, None]) * D + d[None, :], dq, mask=hok[:, None])
    tl.store(dw_ptr + (b * tl.num_programs(0) + s) * H + h, dw * scale, mask=hok)


def topk_logits_launch(q, k, w, idx, scale, out=None, g=None, dq=None, dk=None, dw=None):
    """Forward (out) or, with g, backward (dq [B, S, H, D] fp32, dk [B, T, D] fp32 zeroed, dw [B, S, H] fp32)."""
    B, S, H, D = q.shape
    T, K = k.shape[1], idx.shape[2]
    HP = max(16, triton.next_power_of_2(H))
    BN = 64 if HP > 64 or D > 128 else 128
    common = (H, T, K, scale, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), w.stride(0),
              w.stride(1), idx.stride(0), idx.stride(1))
    if g is None:
        _topk_logits_fwd[(S, B)](q, k, w, idx, out, *common, out.stride(0), out.stride(1), HP=HP, D=D, BN=BN,
                                 num_warps=4)
    else:
        _topk_logits_bwd[(S, B)](q, k, w, idx, g, dq, dk, dw, *common, g.stride(0), g.stride(1), HP=HP, D=D,
                                 BN=BN // 2, num_warps=4)
