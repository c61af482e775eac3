"""Compare xl_paged_decode's v4 candidate variants with v2 on the device (one run, ~2 minutes).

For every variant (a config dict for the launcher): check it against the fp32 reference on fresh random inputs
(G = 1 and G = 2, tails that are not a multiple of the block, garbage table entries, a context of 0), then time
it on both bench shapes and both layouts exactly as the harness does (bench.harness.time_impl: do_bench
median, L2 flushed; inputs from spec's bench cases; copy ceiling measured in the same run).
Usage (repo root, PYTHONPATH=.): python scripts/xl_legacy_sweep.py   -> table on stdout, full output in $OUT.
"""
import json
import os
import sys
import time
import traceback

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import Impl, time_impl
from llmkernels.checking import rel_err
from llmkernels.ops.xl_paged_decode import kernel as K
from llmkernels.ops.xl_paged_decode import spec

# name -> (launcher config, layouts it applies to). v2 = the current default path (the baseline).
VARIANTS = {
    "v2": ({}, ("nhd", "legacy")),
    "v2-nativeK": ({"legacy_k": "native"}, ("legacy",)),
    "reduce": ({"mha_path": "reduce"}, ("nhd", "legacy")),
    "reduce-pf": ({"mha_path": "reduce", "prefetch_table": True}, ("nhd", "legacy")),
    "reduce-pf-n32": ({"mha_path": "reduce", "prefetch_table": True, "block_n": 32}, ("nhd", "legacy")),
    "reduce-pf-n128w8": ({"mha_path": "reduce", "prefetch_table": True, "block_n": 128, "num_warps": 8},
                         ("nhd", "legacy")),
    "reduce-pf-w8": ({"mha_path": "reduce", "prefetch_table": True, "num_warps": 8}, ("nhd", "legacy")),
    "reduce-pf-pps32": ({"mha_path": "reduce", "prefetch_table": True, "programs_per_sm": 32}, ("nhd", "legacy")),
}
if "--round2" in sys.argv:  # more programs in flight for the reduce path (it is not cp.async-pipelined)
    sys.argv.remove("--round2")
    VARIANTS = {"v2": ({}, ("nhd",))}
    for pps in (32, 48, 64):
        for bn, nw in ((64, 4), (32, 4), (64, 8), (32, 2)):
            VARIANTS[f"reduce-pf-pps{pps}-n{bn}w{nw}"] = (
                {"mha_path": "reduce", "prefetch_table": True, "programs_per_sm": pps, "block_n": bn, "num_warps": nw},
                ("legacy",))
if "--round3" in sys.argv:  # around round 2's best (32 programs per SM, 32-token tiles, 2 warps)
    sys.argv.remove("--round3")
    VARIANTS = {"v2": ({}, ("nhd",))}
    for pps in (16, 24, 32):
        for bn, nw in ((32, 2), (32, 1), (16, 1), (64, 2), (16, 2)):
            VARIANTS[f"reduce-pf-pps{pps}-n{bn}w{nw}"] = (
                {"mha_path": "reduce", "prefetch_table": True, "programs_per_sm": pps, "block_n": bn, "num_warps": nw},
                ("legacy",))
if len(sys.argv) > 1:  # optional subset: python scripts/xl_legacy_sweep.py v2 reduce-pf
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in sys.argv[1:]}

out_dir = os.environ.get("OUT")
lines = []


def say(s=""):
    print(s, flush=True)
    lines.append(s)


def launch(x, cfg, out=None, lse=None):
    S, H, D = x["q"].shape
    out = torch.empty_like(x["q"]) if out is None else out
    lse = torch.empty(S, H, device=x["q"].device) if lse is None else lse
    K.xl_paged_decode_fwd(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], x["u"],
                          x["bd"], D ** -0.5, out, lse, config=cfg)
    return out, lse


def check(cfg, layout):
    """max rel err (out and lse, relative to each tolerance's dtype fp16) over a G = 1 and a G = 2 case."""
    worst = 0.0
    for H, Hkv, bd in ((16, 16, "contig"), (16, 8, "strided")):
        ctx = [4096 + 7, 1, 0, 333, 16 * 50, 2000 + 5]
        x = spec.make_inputs(len(ctx), H, Hkv, 128, 16, ctx, layout, torch.float16, "cuda", u="head", bd=bd,
                             table_pad=2)
        S, _, D = x["q"].shape
        out = torch.full((S, H, D), float("nan"), dtype=torch.float16, device="cuda")
        lse = torch.full((S, H), float("nan"), device="cuda")
        launch(x, cfg, out, lse)
        ro, rl = spec.ref(x)
        worst = max(worst, rel_err(out, ro), rel_err(lse, rl))
    return worst


t0 = time.time()
bw = copy_bandwidth()
say(f"device {torch.cuda.get_device_name()}  copy {bw / 1e12:.3f} TB/s  torch {torch.__version__}")
errs, rows = {}, []
for name, (cfg, layouts) in VARIANTS.items():
    for layout in layouts:
        try:
            errs[name, layout] = check(cfg, layout)
            ok = "ok" if errs[name, layout] <= spec.OUT_TOL[torch.float16] else "FAIL"
            say(f"check {name:<18} {layout:<6} max rel err {errs[name, layout]:.2e} {ok}  ({time.time() - t0:.0f}s)")
        except Exception as e:  # a variant that does not compile must not stop the sweep
            errs[name, layout] = None
            say(f"check {name:<18} {layout:<6} ERROR {type(e).__name__}: {str(e)[:300]}")
            lines.append(traceback.format_exc())
            torch.cuda.synchronize()

for case in spec._cases(False):
    layout, S, L = case.shape["layout"], case.shape["num_seqs"], case.shape["context"]
    floor = case.bytes / bw * 1e3
    for name, (cfg, layouts) in VARIANTS.items():
        if layout not in layouts or errs.get((name, layout)) is None:
            continue
        impl = Impl(name, lambda x, cfg=cfg: (lambda: launch(x, cfg)))
        try:
            ms, _ = time_impl(impl, case)
        except Exception as e:
            say(f"time {name} {layout} {S}x{L} ERROR {type(e).__name__}: {str(e)[:300]}")
            torch.cuda.synchronize()
            continue
        finally:
            torch.cuda.empty_cache()
        rows.append({"variant": name, "config": cfg, "layout": layout, "shape": f"{S}x{L}", "ms": ms,
                     "pct_of_floor": 100 * floor / ms, "max_rel_err": errs[name, layout]})
        say(f"time {name:<18} {layout:<6} {S}x{L:<6} {ms:.4f} ms {100 * floor / ms:5.1f} %  ({time.time() - t0:.0f}s)")

say()
say(f"{'variant':<18} {'layout':<6} {'shape':<8} {'ms':>8} {'%floor':>7} {'max rel err':>11}")
for r in sorted(rows, key=lambda r: (r["layout"], r["shape"], r["ms"])):
    say(f"{r['variant']:<18} {r['layout']:<6} {r['shape']:<8} {r['ms']:8.4f} {r['pct_of_floor']:6.1f}% "
        f"{r['max_rel_err']:11.2e}")
say(f"total {time.time() - t0:.0f} s")
if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "xl_legacy_sweep.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "xl_legacy_sweep.json"), "w") as f:
        json.dump({"copy_tbps": bw / 1e12, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
