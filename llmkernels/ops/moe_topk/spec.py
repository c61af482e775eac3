"""Checks of moe_topk: inputs, check(device); benchmarks in llmkernels.bench.specs.moe_topk."""
import torch

from ...checking import generator, result
from .op import moe_topk
from .reference import moe_topk_ref

# name -> (experts, k, sigmoid routing kwargs or None for softmax): the routers moe_topk stands in for
ROUTERS = {"qwen3-moe": (128, 8, None),
           "deepseek-v3": (256, 8, dict(n_group=8, topk_group=4, renormalize=True, scale=2.5))}
W_TOL = 1e-5  # fp32 on both sides: exp / sigmoid and the sums' order differ by a few fp32 steps


def make_inputs(T, router, device, seed=None):
    """Router logits (bf16 for softmax routers as transformers' linear gives them, fp32 for DeepSeek's) and the
    selection bias of a sigmoid router."""
    g = generator(device, seed)
    E, _, sig = ROUTERS[router]
    if sig:  # fp32: a near-tie within rounding is improbable
        x = torch.randn(T, E, device=device, generator=g)
    else:  # bf16 holds few values: distinct ones, (j - E / 2) / 32 in a random order (exact in bf16)
        x = ((torch.rand(T, E, device=device, generator=g).argsort(dim=-1) - E // 2) / 32).to(torch.bfloat16)
    return {"x": x, "bias": torch.randn(E, device=device, generator=g) * 0.1 if sig else None}


def run(x, router, fn=moe_topk, ordered=True):
    """(weights, indices), each row ordered by expert index when ordered (DeepSeek's choice is a set; benchmarks
    time the call alone)."""
    E, k, sig = ROUTERS[router]
    if sig:
        kw = dict(sig)
        renorm = kw.pop("renormalize")
        w, i = (fn(x["x"], k, renorm, scoring="sigmoid", bias=x["bias"], **kw) if fn is moe_topk else
                fn(x["x"], k, renorm, "sigmoid", x["bias"], kw["n_group"], kw["topk_group"], kw["scale"]))
    else:
        w, i = fn(x["x"], k)
    if not ordered:
        return w, i
    order = i.argsort(dim=-1)
    return w.gather(1, order), i.gather(1, order)


def check(device):
    out = []
    for router in ROUTERS:
        for T in (1, 5, 16):
            x = make_inputs(T, router, device)
            w, i = run(x, router)
            rw, ri = run(x, router, moe_topk_ref)
            out.append(result("moe_topk", f"{router} T={T} indices", i.float(), ri.float(), 0.0))
            out.append(result("moe_topk", f"{router} T={T} weights", w, rw, W_TOL))
    return out
