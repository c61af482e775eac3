import torch


def merge_attention_states_ref(outs: torch.Tensor, lses: torch.Tensor):
    """fp32 reference. outs [S, ..., D], lses [S, ...] (natural log). Returns (out [..., D], lse [...]).

    Parts whose lse is -inf (or +inf: sparse_mla's row with no valid index) contribute nothing; if no part
    contributes the result is out 0, lse -inf. A NaN lse makes its row NaN.
    """
    outs = outs.float()
    lses = lses.float()
    lses = torch.where(lses == float("inf"), float("-inf"), lses)
    m = lses.amax(dim=0)
    m_safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    w = torch.exp(lses - m_safe)  # [S, ...]
    denom = w.sum(dim=0)
    empty = denom == 0  # no part saw a key (a NaN lse makes denom NaN: the row stays NaN)
    out = (w.unsqueeze(-1) * outs.masked_fill((w == 0).unsqueeze(-1), 0.0)).sum(dim=0)
    out = out / torch.where(empty, torch.ones_like(denom), denom).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m_safe + torch.log(denom))
    return out, lse
