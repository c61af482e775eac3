"""fp32 reference of row_topk: torch.topk's positions, -1 where the value is -inf (never chosen)."""
import torch


def row_topk_ref(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [R, N] fp32 -> int32 [R, k]: positions of the k largest values (NaN largest, as torch.topk), -1 in place of
    -inf values. Ties may be broken otherwise by the kernel, and its positions are unordered: compare the values."""
    v, i = torch.topk(x.float(), k, dim=-1)
    return torch.where(v == float("-inf"), -1, i).to(torch.int32)
