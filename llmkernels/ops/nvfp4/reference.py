"""fp64-accumulated references for the NVFP4 GEMV and linear (plain PyTorch, any device)."""
from typing import Optional

import torch

from .format import BLOCK, nvfp4_dequantize, unpack_e2m1


def _dequant_lk(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """packed [R, K/2, L], scales [R, K/16, L] -> float64 [L, R, K]."""
    p = packed.view(torch.uint8).permute(2, 0, 1)
    s = scales.float().permute(2, 0, 1)
    vals = unpack_e2m1(p).double()
    return (vals.unflatten(-1, (-1, BLOCK)) * s.double()[..., None]).flatten(-2)


def nvfp4_gemv_ref(a, b, sfa, sfb, alpha: Optional[float] = None) -> torch.Tensor:
    """c[m, 0, l] = alpha * sum_k a[m, k, l] sfa[m, k/16, l] b[0, k, l] sfb[0, k/16, l], as fp32 [M, 1, L]."""
    A = _dequant_lk(a, sfa)                   # [L, M, K]
    B = _dequant_lk(b[:1], sfb[:1])[:, 0]     # [L, K]
    c = torch.einsum("lmk,lk->ml", A, B)
    if alpha is not None:
        c = c * alpha
    return c.unsqueeze(1).float()


def nvfp4_linear_ref(x, packed, scales, global_scale, bias=None) -> torch.Tensor:
    """y = x @ dequant(W)^T (+ bias), fp32 [T, N]."""
    w = nvfp4_dequantize(packed, scales).double()
    y = x.double() @ w.t() * torch.as_tensor(global_scale, dtype=torch.float64, device=x.device)
    if bias is not None:
        y = y + bias.double()
    return y.float()
