"""fp32 reference of moe_topk: transformers' routers after their linear (Qwen2/3-MoE and Mixtral: softmax;
DeepSeek-V3 / V3.2, GLM-4-MoE, GLM-5: sigmoid with a selection bias and group-limited choice)."""
import torch


def moe_topk_ref(logits: torch.Tensor, k: int, renormalize: bool = True, scoring: str = "softmax", bias=None,
                 n_group: int = 1, topk_group: int = 1, scale: float = 1.0):
    """logits [T, E] -> (weights fp32 [T, k], indices int64 [T, k]). softmax: the k most probable experts, weights
    divided by their sum when renormalize. sigmoid: scores sigmoid(logits); choice by scores + bias among the
    topk_group groups (of n_group equal groups) whose two best choice scores sum highest; weights the chosen scores,
    / (their sum + 1e-20) when renormalize; both x scale. (DeepSeek's top-k is unsorted: compare sets.)"""
    if scoring == "softmax":
        p = torch.softmax(logits.float(), dim=-1)
        w, i = torch.topk(p, k, dim=-1)
        if renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return w * scale, i
    T, E = logits.shape
    scores = logits.float().sigmoid()
    choice = scores + (bias.float() if bias is not None else 0)
    if n_group > 1:
        groups = choice.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        mask = torch.zeros_like(groups).scatter_(1, torch.topk(groups, topk_group, dim=-1)[1], 1)
        choice = choice.masked_fill(~mask.bool().repeat_interleave(E // n_group, dim=1), float("-inf"))
    i = torch.topk(choice, k, dim=-1)[1]
    w = scores.gather(1, i)
    if renormalize:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, i
