"""Shared pieces of correctness checks: error metric, NaN poisoning, result rows."""
from dataclasses import dataclass

import torch


@dataclass
class CheckResult:
    op: str
    case: str
    ok: bool
    err: float
    tol: float
    note: str = ""


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over finite reference entries; inf if out has NaN or non-matching infinities."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("inf")
    inf_ref = torch.isinf(ref)
    if not torch.equal(torch.isinf(out), inf_ref) or not torch.equal(out[inf_ref], ref[inf_ref]):
        return float("inf")
    o, r = out[~inf_ref], ref[~inf_ref]
    denom = r.norm().item()
    diff = (o - r).norm().item()
    return diff / denom if denom > 0 else diff


def result(op: str, case: str, out, ref, tol: float) -> CheckResult:
    err = rel_err(out, ref)
    return CheckResult(op, case, err <= tol, err, tol)


def generator(device, seed=None) -> torch.Generator:
    """A generator on device seeded with `seed`, or from the global RNG (a test's torch.manual_seed reproduces it)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int(torch.randint(2 ** 31, (1,))))
    return g


def graph_replay(fn) -> torch.Tensor:
    """fn() (returning one tensor) captured in a CUDA graph, its output poisoned with NaN, then replayed: what the
    replay wrote (compare with an eager call)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return out
