"""Benchmark cases and peers of moe_topk for `llmkernels bench` (its checks: llmkernels.ops.moe_topk.spec): a decode
step's routing of one layer after the router's linear, the choice as transformers' routers make it (torch's ops,
eager and under inductor), the call alone (spec.run's ordering for comparison untimed). Latency-bound: the floor
(logits read, weights and indices written) is nanoseconds, so reports give no % of it."""
import torch

from .. import Case, Impl, OpBench
from ...ops.moe_topk.reference import moe_topk_ref
from ...ops.moe_topk.spec import ROUTERS, make_inputs, run


def _cases(quick):
    out = []
    for router, (E, k, sig) in ROUTERS.items():
        for T in (1,) if quick else (1, 16):
            out.append(Case(shape={"router": router, "T": T, "E": E, "k": k}, timing="graph", bound="latency",
                            bytes=T * E * (4 if sig else 2) + T * k * 12, write_bytes=T * k * 12,
                            make_inputs=lambda T=T, router=router: {**make_inputs(T, router, torch.device("cuda")),
                                                                    "router": router}))
    return out


def _ours(x):
    return lambda: run(x, x["router"], ordered=False)


def _torch(x):
    return lambda: run(x, x["router"], moe_topk_ref, ordered=False)


_COMPILED = []


def _compiled(x):
    if not _COMPILED:
        _COMPILED.append(torch.compile(moe_topk_ref, dynamic=False))
    return lambda: run(x, x["router"], _COMPILED[0], ordered=False)


def benches():
    return [OpBench("moe_topk", _cases, [
        Impl("llmkernels", _ours),
        Impl("torch-ops", _torch),
        Impl("torch-compiled", _compiled),
    ])]
