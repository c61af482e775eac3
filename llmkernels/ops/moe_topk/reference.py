"""fp32 reference of moe_topk: transformers' Qwen3-MoE / Mixtral router after its linear."""
import torch


def moe_topk_ref(logits: torch.Tensor, k: int, renormalize: bool = True):
    """logits [T, E] -> (weights fp32 [T, k], indices int64 [T, k]): softmax over the experts in fp32, the k
    largest probabilities in descending order, divided by their sum when renormalize."""
    p = torch.softmax(logits.float(), dim=-1)
    w, i = torch.topk(p, k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, i
