"""row_topk: the positions of each row's k largest fp32 values, in five launches (the DSA indexer's top
2048 of a decode row's 64K+ scores: torch.topk takes five kernels and ~35 us on the H200)."""
import torch

from ..._launch import cached_plan, current_device, keep_plan, kept_plan, skey, tkey, tracing
from ..._runtime import capturing, num_sms
from ..._validate import check_int, check_same_device, check_tensor, check_unit_last_stride
from ..combine.kernel import split_scratch
from .kernel import SCR, RowTopkPlan


def _scratch(device: torch.device, n: int, m: int) -> tuple:
    """(>= n int32 zeros, >= m int32) for a call: eager calls take the per-stream split scratch the decode kernels
    share (combine.split_scratch: its counters are zero between calls, and row_topk leaves them so; its fp32 parts
    hold the programs' counts), freed by llmkernels.empty_cache(); fresh ones under CUDA-graph capture (a graph may
    be replayed beside other work)."""
    if capturing(device):
        return torch.zeros(n, dtype=torch.int32, device=device), torch.empty(m, dtype=torch.int32, device=device)
    parts, counters = split_scratch(device, m, n)[:2]
    return counters, parts.view(torch.int32)


def _plan(x: torch.Tensor, k: int) -> RowTopkPlan:
    """The cached launches for x's shape, strides and alignment (what the kept kernels specialise on) and k."""
    R, N = x.shape
    return cached_plan((_PLANS, current_device(), tkey(x), k), lambda: RowTopkPlan(R, N, k, x.stride(0),
                                                                                 num_sms(x.device)))


def _run(x: torch.Tensor, k: int, plan=None) -> torch.Tensor:
    out = torch.empty(x.shape[0], k, dtype=torch.int32, device=x.device)
    if x.shape[0]:
        plan = plan or _plan(x, k)
        plan(x, out, *_scratch(x.device, plan.n_scratch, plan.n_counts))
    return out


@torch.library.custom_op("llmkernels::row_topk", mutates_args=())
def _op(x: torch.Tensor, k: int) -> torch.Tensor:
    return _run(x, k)


@_op.register_fake
def _(x, k):
    return x.new_empty(x.shape[0], k, dtype=torch.int32)


_SITE, _PLANS = "row_topk", "row_topk.plan"


def row_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """The positions of the k largest values of each row of x [R, N] (fp32, unit last stride, any row stride), as
    int32 [R, k]: those above the k-th largest value in ascending order, then the lowest positions holding a value
    equal to it; 1 <= k <= N. NaN ranks above every number (as in torch.topk); -inf values are never chosen: a row
    with fewer than k values above -inf gets all of them, then -1. The same result every call (torch.topk may
    choose other positions among equal values, and orders them by value). Not differentiable (positions). Made for
    the DSA indexer's top-k of a decode row; torch.topk is the tool for sorted values."""
    key = None if tracing() else (_SITE, current_device(), tkey(x), skey(k))
    plan = kept_plan(key, (x,))
    if plan is not None:
        return _run(x, k, plan)
    check_tensor("x", x, dtypes=(torch.float32,), ndim=2)
    check_unit_last_stride("x", x)
    if not x.shape[1]:
        raise ValueError(f"x has no columns to choose from (shape {tuple(x.shape)})")
    check_int("k", k, lo=1, hi=x.shape[1])
    if x.shape[1] >= 2 ** 31 - 1 or x.shape[0] * SCR.value >= 2 ** 31:
        raise ValueError(f"x of shape {tuple(x.shape)} is too large (int32 positions and scratch offsets)")
    check_same_device(x=x)
    plan = keep_plan(key, lambda: _plan(x, k), (x,))
    if plan is not None:
        return _run(x, k, plan)
    return _op(x, k)
