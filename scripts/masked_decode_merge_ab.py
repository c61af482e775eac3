"""A/B of masked_decode's merge: separate merge kernel (PDL) vs fused (the row's last split merges), on the GPU.

Usage (device, repo root, PYTHONPATH=.): python scripts/masked_decode_merge_ab.py [--reps N] [--no-check] [--few]
  [--variants a,b,...] (names from VARIANTS; default kernel,fused)
Checks the fused path against the fp32 reference first (bf16, odd length, varlen, an all-dropped row, NaN-poisoned
outputs, eager and graph-captured, tickets left at zero), then times both with 3 rotated input sets per case,
alternating A/B so drift hits both. Output also goes to $OUT/masked_decode_merge_ab.txt.
"""
import os
import statistics
import sys

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.masked_decode import kernel as K
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import HKV, HQ, D, LSE_TOL, OUT_TOL, _bytes, make_inputs

log = open(os.path.join(os.environ["OUT"], "masked_decode_merge_ab.txt"), "w") if os.environ.get("OUT") else None
reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 2
VARIANTS = {"kernel": {}, "fused": {"merge": "fused"}, "fused_late": {"merge": "fused", "trigger": "late"},
            "kernel_late": {"trigger": "late"}, "fused_nopdl": {"merge": "fused", "pdl": False},
            "kernel_nopdl": {"pdl": False}}
names = sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv else ["kernel", "fused"]


def say(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    if log:
        log.write(line + "\n")
        log.flush()


dev = torch.device("cuda")
bad = 0
for (B, Hkv, G, L, Dh) in [] if "--no-check" in sys.argv else [
        (3, 2, 4, 20011, 128), (1, 8, 4, 65536, 128), (2, 4, 16, 9001, 64), (1, 1, 64, 5000, 128), (2, 2, 8, 7777, 256)]:
    x = make_inputs(B, Hkv, Hkv * G, L, Dh, torch.bfloat16, dev, kept=0.5)
    x["drop"][-1, -1] = True
    lens = torch.randint(0, L + 1, (B,), dtype=torch.int32, device=dev)
    for kl in (None, lens):
        ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kl)
        for mask in (x["drop"], None):
            if mask is None:
                ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], None, kl)
            for capture in (False, True):
                out = torch.full_like(x["q"], float("nan"))
                lse = torch.full(x["q"].shape[:2], float("nan"), device=dev)
                fn = lambda: K.masked_decode_fwd(x["q"], x["k"], x["v"], mask, kl, L, Dh ** -0.5, out, lse,
                                                 VARIANTS[names[-1]])
                if capture:
                    fn()
                    out.fill_(float("nan"))
                    lse.fill_(float("nan"))
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fn()
                    out.fill_(float("nan"))
                    lse.fill_(float("nan"))
                    g.replay()
                    g.replay()
                else:
                    fn()
                    fn()
                torch.cuda.synchronize()
                eo, el = rel_err(out, ro), rel_err(lse, rl)
                ok = eo <= OUT_TOL[torch.bfloat16] and el <= LSE_TOL and not out.isnan().any()
                bad += not ok
                if not ok:
                    say("WRONG", B, Hkv, G, L, Dh, kl is not None, mask is not None, capture, eo, el)
tick = [t for t in K._STREAM_COUNTERS.values()] + [p[0] for p in K._CAPTURE_POOL.values()]
nz = sum(int((t != 0).sum()) for t in tick)
say(f"correctness: {bad} wrong; nonzero tickets left: {nz}")

bw = copy_bandwidth()
say(f"copy {bw / 1e12:.3f} TB/s")
cases = [(1, 65536, 1.0), (1, 65536, 0.5), (2, 65536, 1.0), (2, 65536, 0.5), (4, 65536, 1.0), (4, 65536, 0.5),
         (8, 65536, 1.0), (8, 65536, 0.5), (32, 8192, 1.0), (32, 8192, 0.5), (1, 1048576, 1.0), (1, 1048576, 0.5),
         (1, 65536, 1.0)]
if "--few" in sys.argv:
    cases = [(1, 65536, 1.0), (1, 65536, 0.5), (2, 65536, 1.0), (8, 65536, 1.0), (8, 65536, 0.5), (1, 65536, 1.0)]
rows = []
for B, L, kept in cases:
    sets = [make_inputs(B, HKV, HQ, L, D, torch.float16, dev, kept=kept) for _ in range(3)]
    outs = [(torch.empty(B, HQ, D, dtype=torch.float16, device=dev), torch.empty(B, HQ, device=dev)) for _ in sets]
    floor = _bytes(B, L, 1.0) / bw * 1e3
    res = {n: [] for n in names}
    for _ in range(reps if B > 1 or kept < 1 else 2 * reps):
        for merge in res:
            fns = [lambda x=x, o=o, merge=merge: K.masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L,
                                                                       D ** -0.5, o[0], o[1], VARIANTS[merge])
                   for x, o in zip(sets, outs)]
            res[merge].append(100 * floor / _graph_time_ms(fns, calls=max(3, min(48, int(2.0 / floor))), reps=10))
    line = f"B={B} L={L} kept={kept}: " + "  ".join(
        f"{m} " + " ".join(f"{p:.1f}" for p in v) + f" (median {statistics.median(v):.1f} % dense)" for m, v in res.items())
    say(line)
    rows.append((B, L, kept, [statistics.median(v) for v in res.values()]))
    del sets, outs
    torch.cuda.empty_cache()
say("\nB L kept | " + " | ".join(f"{n} %dense (x dense floor)" for n in names))
for B, L, kept, meds in rows:
    say(f"{B} {L} {kept} | " + " | ".join(f"{a:.1f} ({100 / a:.3f}x)" for a in meds))
