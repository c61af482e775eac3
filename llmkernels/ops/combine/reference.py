import torch


def merge_attention_states_ref(outs: torch.Tensor, lses: torch.Tensor):
    """fp32 reference. outs [S, ..., D], lses [S, ...] (natural log). Returns (out [..., D], lse [...]).

    Parts whose lse is -inf (or +inf: sparse_mla's row with no valid index) contribute nothing; if no part
    contributes the result is out 0, lse -inf.
    """
    outs = outs.float()
    lses = lses.float()
    lses = torch.where(lses == float("inf"), float("-inf"), lses)
    m = lses.amax(dim=0)
    m_safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    w = torch.exp(lses - m_safe)  # [S, ...]
    denom = w.sum(dim=0)
    out = (w.unsqueeze(-1) * outs).sum(dim=0) / torch.where(denom > 0, denom, torch.ones_like(denom)).unsqueeze(-1)
    lse = torch.where(denom > 0, m_safe + torch.log(denom), torch.full_like(m, float("-inf")))
    return out, lse
