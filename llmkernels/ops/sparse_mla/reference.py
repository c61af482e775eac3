"""fp32 PyTorch references for DeepSeek-V3.2-style sparse MLA (forward, attention distribution, KL loss).

Index t of query row i is valid iff 0 <= t < s_kv, and (causal: q_start given) t <= (q_start + i + 1 -
k_stride) // k_stride, and (topk_length given) its position j < topk_length[i]. Invalid entries are
never gathered. Duplicates count once per listing. Differentiable w.r.t. q, kv and attn_sink, so autograd
through these functions is the reference for the backward pass.
"""
from typing import Optional, Union

import torch

IntOrTensor = Union[int, torch.Tensor, None]


def valid_mask(indices: torch.Tensor, s_kv: int, q_start: IntOrTensor = None, k_stride: int = 1,
               topk_length: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bool [s_q, topk]: which listed indices are attended."""
    indices = indices.reshape(indices.shape[0], -1).long()
    s_q, topk = indices.shape
    ok = (indices >= 0) & (indices < s_kv)
    if q_start is not None:
        qs = int(q_start.reshape(-1)[0].item()) if isinstance(q_start, torch.Tensor) else int(q_start)
        rows = torch.arange(s_q, device=indices.device) + qs
        limit = torch.div(rows + 1 - k_stride, k_stride, rounding_mode="floor")
        ok &= indices <= limit[:, None]
    if topk_length is not None:
        ok &= torch.arange(topk, device=indices.device)[None, :] < topk_length.reshape(-1, 1).long()
    return ok


def _logits(q, kv, indices, valid, sm_scale):
    """fp32 logits [s_q, h_q, topk], -inf where invalid; gathers only valid rows (others read row 0)."""
    kv2 = kv.reshape(kv.shape[0], -1).float()
    idx = torch.where(valid, indices.reshape(valid.shape).long(), torch.zeros_like(valid, dtype=torch.long))
    kg = kv2[idx] if kv2.shape[0] > 0 else kv2.new_zeros(*idx.shape, kv2.shape[-1])  # [s_q, topk, d_qk]
    kg = kg.masked_fill(~valid[..., None], 0.0)  # invalid entries are never read (row 0 may hold NaN)
    s = torch.einsum("ihd,ijd->ihj", q.float(), kg) * sm_scale
    return s.masked_fill(~valid[:, None, :], float("-inf")), kg


def sparse_mla_fwd_ref(q, kv, indices, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None,
                       q_start: IntOrTensor = None, k_stride: int = 1):
    """Returns (out [s_q, h_q, d_v] fp32, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32, natural log).

    attn_sink [h_q] adds exp(attn_sink[h]) to the softmax denominator. A row with no valid index gets
    out = 0, max_logits = -inf and lse = +inf (so exp(s - lse) = 0 downstream), with or without a sink.
    """
    valid = valid_mask(indices, kv.shape[0], q_start, k_stride, topk_length)
    s, kg = _logits(q, kv, indices, valid, sm_scale)
    max_logits = s.amax(dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    if attn_sink is not None:
        lse = torch.logaddexp(lse, attn_sink.float()[None, :])
    empty = ~valid.any(dim=-1)  # [s_q]
    lse_safe = torch.where(empty[:, None], torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe[..., None])  # 0 at invalid entries
    out = torch.einsum("ihj,ijd->ihd", p, kg[..., :d_v])
    lse = torch.where(empty[:, None], torch.full_like(lse, float("inf")), lse)
    return out, max_logits, lse


def sparse_mla_attn_dist_ref(q, kv, indices, lse, sm_scale: float, q_start: IntOrTensor = None,
                             k_stride: int = 1, topk_length=None):
    """[s_q, topk] fp32: sum over heads of exp(q_h . kv_t * sm_scale - lse_h) at valid t, exactly 0 elsewhere."""
    valid = valid_mask(indices, kv.shape[0], q_start, k_stride, topk_length)
    s, _ = _logits(q, kv, indices, valid, sm_scale)
    p = torch.exp(s - lse.float()[..., None])  # lse = +inf (empty row) or s = -inf gives 0
    return p.sum(dim=1).masked_fill(~valid, 0.0)


def indexer_kl_loss_ref(index_logits, q, kv, indices, lse, sm_scale: float, q_start: IntOrTensor = None,
                        k_stride: int = 1, topk_length=None, attn_dist=None):
    """sum over rows of KL(p || softmax(index_logits over valid t)); p = L1-normalised attention distribution
    (attn_dist when given, e.g. the all-reduced one of tensor-parallel head shards).

    Rows with no valid index (or zero attention mass) contribute 0. Differentiable w.r.t. index_logits.
    """
    valid = valid_mask(indices, kv.shape[0], q_start, k_stride, topk_length)
    with torch.no_grad():
        dist = attn_dist.float() if attn_dist is not None else sparse_mla_attn_dist_ref(
            q, kv, indices, lse, sm_scale, q_start, k_stride, topk_length)
        mass = dist.sum(dim=-1, keepdim=True)
        p = dist / torch.where(mass == 0, torch.ones_like(mass), mass)  # a NaN mass stays NaN
    logits = index_logits.float().masked_fill(~valid, float("-inf"))
    row_ok = valid.any(dim=-1, keepdim=True)
    logq = torch.log_softmax(torch.where(row_ok, logits, torch.zeros_like(logits)), dim=-1)
    pos = p != 0  # NaN counts: it must reach the loss
    terms = torch.where(pos, p * (torch.log(torch.where(pos, p, torch.ones_like(p))) - logq), torch.zeros_like(p))
    return terms.sum()
