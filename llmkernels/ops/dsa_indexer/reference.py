"""fp32 reference of the DSA indexer's scores (DeepSeek-V3.2 / GLM-5), as transformers computes them."""
from typing import Optional

import torch


def dsa_index_scores_ref(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, sm_scale: float,
                         positions: Optional[torch.Tensor] = None, key_start: int = 0,
                         key_end: Optional[int] = None) -> torch.Tensor:
    """scores[b, s, t] = sum_h weights[b, s, h] * relu(sm_scale * q[b, s, h] . k[b, t]) for the keys
    key_start <= t < key_end, -inf where t > positions[b, s] (positions [B or 1, S]; None: no mask). fp32 [B, S, n]."""
    key_end = k.shape[1] if key_end is None else key_end
    kk = k[:, key_start:key_end].float()
    s = torch.relu(torch.einsum("bshd,btd->bsht", q.float(), kk) * sm_scale)
    out = torch.einsum("bsh,bsht->bst", weights.float(), s)
    if positions is not None:
        t = torch.arange(key_start, key_end, device=k.device)
        out = out.masked_fill(t.view(1, 1, -1) > positions.view(positions.shape[0], -1, 1), float("-inf"))
    return out


def dsa_topk_logits_ref(q, k, weights, indices, sm_scale):
    """fp32 [B, S, topk]: sum_h weights * relu(sm_scale q_h . k[indices]) at the selected keys, 0 where not a key."""
    B, S, K = indices.shape
    ok = (indices >= 0) & (indices < k.shape[1])
    kk = k.float().gather(1, torch.where(ok, indices, 0).long().view(B, -1, 1).expand(-1, -1, k.shape[-1]))
    s = torch.relu(torch.einsum("bshd,bsjd->bshj", q.float(), kk.view(B, S, K, -1)) * sm_scale)
    return torch.einsum("bsh,bshj->bsj", weights.float(), s).masked_fill(~ok, 0)
