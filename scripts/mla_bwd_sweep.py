"""On the GPU: time sparse_mla_bwd variants (VARIANTS: overrides of the sm_90 Gluon second pass, `g_ws`) at the
benchmark shape, and a per-kernel breakdown.

  python scripts/mla_bwd_sweep.py [--out DIR]
Prints one line per config (ms, TFLOP/s by the issue's count) and the kernel-time split of the default.
"""
import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.getcwd())
from llmkernels.ops.sparse_mla import spec_bwd  # noqa: E402
from llmkernels.ops.sparse_mla.bwd import flops, sparse_mla_bwd_launch  # noqa: E402
from llmkernels.checking import rel_err  # noqa: E402
from llmkernels.ops.sparse_mla.common import prepare  # noqa: E402

# Gluon second pass (bwd_wgmma.grads_ws_launch) variants; None = what the public op runs. RED 2 is a timing probe
# (no dKV reductions: its dkv is wrong, so it is not compared)
G = lambda **kw: dict(g_ws=kw)  # noqa: E731
VARIANTS = {
    128: [None, G(RED=2)],
    64: [None, G(DC=128), G(RED=2)],
}
PROBES = ({"RED": 2},)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--heads", default="128,64")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, best = [], {}
    for h in [int(v) for v in args.heads.split(",")]:
        t0 = time.time()
        x = spec_bwd.make_inputs(4096, 8192, h, 2048, 576, torch.bfloat16, torch.device("cuda"))
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        fl = flops(4096, h, 2048, 576)
        print(f"h={h}: inputs in {time.time() - t0:.1f}s", flush=True)
        dq = torch.empty_like(x["q"])

        def bench(cfg, det=False):
            f = lambda: sparse_mla_bwd_launch(a, x["out"], x["dout"], x["lse"], None, dq, deterministic=det,  # noqa
                                              config=cfg)
            try:
                t0 = time.time()
                f()
                torch.cuda.synchronize()
                comp = time.time() - t0
                ms = triton.testing.do_bench(f, warmup=25, rep=150, return_mode="median")
                return ms, comp
            except Exception as e:  # a config that does not fit (shared memory) must not stop the sweep
                print(f"   failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                torch.cuda.synchronize()
                return float("nan"), 0.0

        first = None
        for cfg in VARIANTS[h]:
            ms, comp = bench(cfg)
            # every variant must compute what the first (tested) one does: P/dS rounding may differ slightly
            diff = float("nan")
            probe = cfg is not None and cfg.get("g_ws") in PROBES
            if ms == ms and not probe:
                got = (dq.clone(), sparse_mla_bwd_launch(a, x["out"], x["dout"], x["lse"], None, dq, config=cfg)[0])
                first = first or got
                diff = max(rel_err(got[0], first[0]), rel_err(got[1], first[1]))
            if diff > 1e-2:
                print(f"   variant differs from the first by {diff:.2e}: dropped", flush=True)
                ms = float("nan")
            row = dict(h=h, variant="cfg", cfg=cfg, ms=ms, tflops=fl / ms / 1e9, first_call_s=comp, diff=diff)
            rows.append(row)
            desc = " ".join(f"{k}={v}" for k, v in (cfg or {"default": ""}).items())
            print(f"h={h} {desc:<130} "
                  f"{ms:8.3f} ms {row['tflops']:6.1f} TFLOP/s (first call {comp:.1f}s, diff {diff:.1e})", flush=True)
        done = [r for r in rows if r["h"] == h and r["variant"] == "cfg" and r["ms"] == r["ms"]
                and (r["cfg"] is None or r["cfg"].get("g_ws") not in PROBES)]
        best[h] = min(done, key=lambda r: r["ms"])["cfg"]
        print(f"h={h} best: {best[h]}", flush=True)
        ms, _ = bench(best[h], det=True)
        print(f"h={h} deterministic: {ms:.3f} ms {fl / ms / 1e9:.1f} TFLOP/s", flush=True)
        rows.append(dict(h=h, variant="deterministic", ms=ms, tflops=fl / ms / 1e9))
        # per-kernel split of the default and deterministic modes
        for det in (False, True):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    sparse_mla_bwd_launch(a, x["out"], x["dout"], x["lse"], None, dq, deterministic=det,
                                          config=best[h])
                torch.cuda.synchronize()
            split = {}
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    split[ev.name[:60]] = split.get(ev.name[:60], 0.0) + ev.device_time / 3e3
            top = sorted(split.items(), key=lambda kv: -kv[1])[:8]
            print(f"h={h} {'det' if det else 'default'} kernel split (ms/call): " +
                  ", ".join(f"{k}={v:.3f}" for k, v in top), flush=True)
            rows.append(dict(h=h, variant=f"split-{'det' if det else 'default'}", split=dict(top)))
        del x, a, dq
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
