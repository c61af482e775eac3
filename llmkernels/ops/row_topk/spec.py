"""Checks of row_topk: inputs, check(device); benchmarks in llmkernels.bench.specs.row_topk."""
import torch

from ...checking import generator, result
from .op import row_topk
from .reference import row_topk_ref


def make_inputs(R, N, device, ties=False, seed=None):
    """Scores like the DSA indexer's (sums of weighted ReLUs): fp32 [R, N]; ties: a third of them exactly 0."""
    g = generator(device, seed)
    x = torch.randn(R, N, device=device, generator=g)
    if ties:
        x = torch.relu(x)
        x[:, ::3] = 0
    return {"x": x}


def chosen(x, pos):
    """Each row's chosen values in ascending order (the comparison: ties may pick other positions), -1 left out."""
    return torch.sort(torch.where(pos >= 0, x.gather(1, pos.clamp(min=0).long()), float("-inf")), dim=-1)[0]


def check(device):
    out = []
    for R, N, k, ties in ((1, 3000, 200, False), (3, 5000, 64, True), (2, 700, 700, False), (1, 2049, 2048, True)):
        x = make_inputs(R, N, device, ties)["x"]
        got, ref = chosen(x, row_topk(x, k)), chosen(x, row_topk_ref(x, k))
        out.append(result("row_topk", f"R={R} N={N} k={k}{' ties' if ties else ''}", got, ref, 0.0))
    return out
