"""Tune xl_paged_decode on the device: tile, warps, stages, then the split count, at the bench shapes.

Times the launcher directly (do_bench median, L2 flushed) and prints % of the byte floor (copy rate
measured in the same run). Usage: python scripts/xl_paged_decode_sweep.py [--quick]
"""
import sys

import torch
import triton

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.ops.xl_paged_decode import kernel as K
from llmkernels.ops.xl_paged_decode import spec

quick = "--quick" in sys.argv
bw = copy_bandwidth()
print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
# num_stages 4 compiles to the same code as 3 here (the table -> K/V chain caps the pipeline depth; see sass script)
kernel_cfgs = [dict(block_n=n, num_warps=w, num_stages=st)
               for n, w, st in ((64, 4, 2), (32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 8, 2))]
if quick:
    kernel_cfgs = kernel_cfgs[:3]
rows = []


def time_cfg(x, cfg):
    S, H, D = x["q"].shape
    out = torch.empty_like(x["q"])
    lse = torch.empty(S, H, device="cuda")
    fn = lambda: K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"],  # noqa: E731
                                       x["context_lens"], x["u"], x["bd"], D ** -0.5, out, lse, config=cfg)
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


for case in spec._cases(False):
    x = case.make_inputs()
    floor = case.bytes / bw * 1e3
    tag = " ".join(f"{k}={case.shape[k]}" for k in ("num_seqs", "context", "layout"))
    best = None
    for kc in kernel_cfgs:
        cfg = dict(kc, programs_per_sm=16)
        try:
            ms = time_cfg(x, cfg)
        except Exception as e:  # e.g. out of shared memory / registers
            print(f"{tag} {cfg} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        rows.append((tag, cfg, ms, 100 * floor / ms))
        print(f"{tag} {cfg} {ms:.4f} ms {100 * floor / ms:.1f}%", flush=True)
        if best is None or ms < best[1]:
            best = (kc, ms)
    for pps in (8, 32):
        cfg = dict(best[0], programs_per_sm=pps)
        ms = time_cfg(x, cfg)
        rows.append((tag, cfg, ms, 100 * floor / ms))
        print(f"{tag} {cfg} {ms:.4f} ms {100 * floor / ms:.1f}%", flush=True)
    del x
    torch.cuda.empty_cache()

print("\nbest per case:")
for tag in dict.fromkeys(r[0] for r in rows):
    r = sorted((r for r in rows if r[0] == tag), key=lambda r: r[2])
    print(f"{tag}: " + " | ".join(f"{c['block_n']}/{c['num_warps']}w/{c['num_stages']}s/pps{c['programs_per_sm']} "
                                  f"{ms:.4f}ms {pct:.1f}%" for _, c, ms, pct in r[:3]))
