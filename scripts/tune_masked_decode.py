"""Sweep masked_decode launch plans on the GPU (graph replay); prints % of the dense floor per case and plan.

Usage (device, repo root): python scripts/tune_masked_decode.py [--quick]. Every config's line goes to stdout
(and $OUT/masked_decode_sweep.txt when OUT is set); the last lines are a table of the best split and stream
configs per case.
"""
import itertools
import os
import sys

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.masked_decode.kernel import CHOICES, masked_decode_fwd
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import HKV, HQ, D, _bytes, make_inputs

log = open(os.path.join(os.environ["OUT"], "masked_decode_sweep.txt"), "w") if os.environ.get("OUT") else None


def say(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    if log:
        log.write(line + "\n")
        log.flush()


bw = copy_bandwidth()
say(f"copy {bw / 1e12:.3f} TB/s")
shapes = [(1, 65536), (2, 65536), (4, 65536), (8, 65536), (32, 8192), (1, 1048576)]
configs = [dict(plan="split", waves=w, num_stages=s, block_n=128) for w, s in CHOICES + ((1, 2), (2, 3))]
configs += [dict(plan="stream", per_sm=p, num_stages=s, block_n=bn)
            for p, s, bn in itertools.product([1, 2, 3], [2, 3], [64, 128])]
if "--round2" in sys.argv:  # PDL chain on/off, deeper pipelines, and the cost of the combine launch
    configs = [dict(plan="split", waves=2, num_stages=2, block_n=128, pdl=p) for p in (False, True)]
    configs += [dict(plan="stream", per_sm=ps, num_stages=ns, block_n=bn, pdl=p)
                for ps, ns, bn in ((2, 3, 64), (2, 2, 128)) for p in (False, True)]
    configs += [dict(plan="stream", per_sm=2, num_stages=4, block_n=64), dict(plan="stream", per_sm=1, num_stages=4, block_n=128),
                dict(plan="stream", per_sm=3, num_stages=3, block_n=32), dict(plan="stream", per_sm=2, num_stages=3, block_n=64, num_warps=8)]
if "--round3" in sys.argv:  # the split plan with the tile/depth that won the sparse cases of round 2
    configs = [dict(plan="split", waves=w, num_stages=ns, block_n=bn, num_warps=nw)
               for w, ns, bn, nw in itertools.product([2, 3], [2, 3], [64, 128], [2, 4])]
    configs += [dict(plan="stream", per_sm=2, num_stages=3, block_n=64, num_warps=nw) for nw in (2, 4)]
if "--quick" in sys.argv:
    shapes = shapes[:2]

# correctness of every config once, on an odd shape (both plans, varlen, an all-dropped row)
x = make_inputs(3, HKV, HQ, 20011, D, torch.bfloat16, torch.device("cuda"), kept=0.5)
x["drop"][1, 2] = True
lens = torch.tensor([20011, 777, 0], dtype=torch.int32, device="cuda")
for kl in (None, lens):
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kl)
    for cfg in configs:
        out = torch.full_like(x["q"], float("nan"))
        lse = torch.full(x["q"].shape[:2], float("nan"), device="cuda")
        masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], kl, 20011, D ** -0.5, out, lse, cfg)
        e, el = rel_err(out, ro), rel_err(lse, rl)
        if not (e <= 1.2e-2 and el <= 1e-4):
            say("WRONG", cfg, "varlen" if kl is not None else "", e, el)
say("correctness pass done")
del x

best = []
for B, L in shapes:
    for kept in (1.0, 0.5):
        x = make_inputs(B, HKV, HQ, L, D, torch.float16, torch.device("cuda"), kept=kept)
        out = torch.empty(B, HQ, D, dtype=torch.float16, device="cuda")
        lse = torch.empty(B, HQ, device="cuda")
        dense_floor = _bytes(B, L, 1.0) / bw * 1e3
        res = {}
        for cfg in configs:
            fn = lambda cfg=cfg: masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, out, lse, cfg)
            try:
                ms = _graph_time_ms([fn], calls=16, reps=10)
            except Exception as e:  # noqa: BLE001
                say("fail", cfg, type(e).__name__, str(e)[:200])
                continue
            res[tuple(sorted(cfg.items()))] = ms
            say(f"B={B} L={L} kept={kept} {cfg}: {ms * 1e3:.1f} us  {100 * dense_floor / ms:.1f}% dense  "
                f"{ms / dense_floor:.3f}x")
        if "--round2" in sys.argv:  # what the merge launch costs: the same stream kernel without it (wrong output)
            import llmkernels.ops.masked_decode.kernel as K
            keep, K.combine = K.combine, lambda *a: None
            cfg = configs[2]
            fn = lambda: masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, out, lse, cfg)
            ms = _graph_time_ms([fn], calls=16, reps=10)
            K.combine = keep
            say(f"B={B} L={L} kept={kept} NO-COMBINE {cfg}: {ms * 1e3:.1f} us  {100 * dense_floor / ms:.1f}% dense")
        for plan in ("split", "stream"):
            mine = {k: v for k, v in res.items() if dict(k)["plan"] == plan}
            if mine:
                k = min(mine, key=mine.get)
                best.append((B, L, kept, plan, mine[k], dense_floor, dict(k)))
        del x
        torch.cuda.empty_cache()
say("\nB L kept plan us %dense x_dense best_cfg")
for B, L, kept, plan, ms, fl, cfg in best:
    cfg = {k: v for k, v in cfg.items() if k != "plan"}
    say(B, L, kept, plan, f"{ms * 1e3:.1f}", f"{100 * fl / ms:.1f}", f"{ms / fl:.3f}", cfg)
