"""Sweep masked_decode launch configs on the GPU (graph replay); prints % of the dense floor per case and config.

Usage (device, repo root, PYTHONPATH=.): python scripts/tune_masked_decode.py [--quick]. Every config's line goes to
stdout (and $OUT/masked_decode_sweep.txt when OUT is set); the last lines are the best config per case. The
earlier sweeps (rounds 1-3, with the since-removed stream plan) are in benchmarks/notes/masked_decode_sweep_*.txt.
"""
import itertools
import sys

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.masked_decode.kernel import masked_decode_fwd
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import HKV, HQ, D, LSE_TOL, OUT_TOL, _bytes, make_inputs

from _say import teller  # noqa: E402  (scripts/ is on sys.path when run as a script)

say = teller("masked_decode_sweep.txt")


bw = copy_bandwidth()
say(f"copy {bw / 1e12:.3f} TB/s")
shapes = [(1, 65536), (2, 65536), (4, 65536), (8, 65536), (32, 8192), (1, 1048576)]
configs = [dict(waves=w, block_n=bn, num_stages=ns, num_warps=nw)
           for w, (bn, ns), nw in itertools.product([1, 2, 3], [(128, 2), (64, 3), (64, 2)], [2, 4])]
if "--quick" in sys.argv:
    shapes = shapes[:2]
if "--round5" in sys.argv:  # 2026-11-23 round 5: 3 programs per SM (splits now rounded down), deeper rings
    shapes = shapes[:2]
    configs = [dict(waves=w, block_n=bn, num_stages=ns, num_warps=nw)
               for w, (bn, ns), nw in itertools.product([2, 3], [(64, 3), (64, 4), (32, 4), (32, 6)], [2, 4])]
    configs += [dict(waves=1, block_n=128, num_stages=3, num_warps=nw) for nw in (4, 8)]

# every config once against the fp32 reference on an odd shape (varlen, an all-dropped row, NaN-poisoned outputs)
x = make_inputs(3, HKV, HQ, 20011, D, torch.bfloat16, torch.device("cuda"), kept=0.5)
x["drop"][1, 2] = True
for kl in (None, torch.tensor([20011, 777, 0], dtype=torch.int32, device="cuda")):
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kl)
    for cfg in configs:
        out = torch.full_like(x["q"], float("nan"))
        lse = torch.full(x["q"].shape[:2], float("nan"), device="cuda")
        masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], kl, 20011, D ** -0.5, out, lse, cfg)
        if not (rel_err(out, ro) <= OUT_TOL[torch.bfloat16] and rel_err(lse, rl) <= LSE_TOL):
            say("WRONG", cfg, "varlen" if kl is not None else "", rel_err(out, ro), rel_err(lse, rl))
say("correctness pass done")
del x

best = []
for B, L in shapes:
    for kept in (1.0, 0.5):
        x = make_inputs(B, HKV, HQ, L, D, torch.float16, torch.device("cuda"), kept=kept)
        out = torch.empty(B, HQ, D, dtype=torch.float16, device="cuda")
        lse = torch.empty(B, HQ, device="cuda")
        dense_floor = _bytes(B, L, 1.0) / bw * 1e3
        res = []
        for cfg in configs:
            fn = lambda cfg=cfg: masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, out, lse, cfg)
            try:
                ms = _graph_time_ms([fn], calls=16, reps=10)
            except Exception as e:  # noqa: BLE001
                say("fail", cfg, type(e).__name__, str(e)[:200])
                continue
            res.append((ms, cfg))
            say(f"B={B} L={L} kept={kept} {cfg}: {ms * 1e3:.1f} us  {100 * dense_floor / ms:.1f}% dense  "
                f"{ms / dense_floor:.3f}x")
        ms, cfg = min(res, key=lambda t: t[0])
        best.append((B, L, kept, ms, dense_floor, cfg))
        del x
        torch.cuda.empty_cache()
say("\nB L kept us %dense x_dense best_cfg")
for B, L, kept, ms, fl, cfg in best:
    say(B, L, kept, f"{ms * 1e3:.1f}", f"{100 * fl / ms:.1f}", f"{ms / fl:.3f}", cfg)
