"""On the GPU: time sparse_mla_bwd block configs at the benchmark shape, and a per-kernel breakdown.

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
from llmkernels.ops.sparse_mla.bwd import default_config, flops, sparse_mla_bwd_launch  # noqa: E402
from llmkernels.ops.sparse_mla.common import prepare  # noqa: E402

P_CFGS = [dict(p_bh=64, p_bn=32, p_warps=8, p_stages=2), dict(p_bh=64, p_bn=32, p_warps=4, p_stages=3),
          dict(p_bh=64, p_bn=32, p_warps=4, p_stages=2)]
G_CFGS = {128: [dict(g_bh=128, g_bn=64, g_dc=128, g_warps=8, g_stages=2),
                dict(g_bh=128, g_bn=64, g_dc=64, g_warps=8, g_stages=2),
                dict(g_bh=128, g_bn=64, g_dc=128, g_warps=8, g_stages=3),
                dict(g_bh=64, g_bn=64, g_dc=128, g_warps=8, g_stages=2)],
          64: [dict(g_bh=64, g_bn=64, g_dc=128, g_warps=8, g_stages=2),
               dict(g_bh=64, g_bn=64, g_dc=128, g_warps=4, g_stages=3),
               dict(g_bh=64, g_bn=128, g_dc=128, g_warps=8, g_stages=1)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--heads", default="128,64")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for h in [int(v) for v in args.heads.split(",")]:
        t0 = time.time()
        x = spec_bwd.make_inputs(4096, 8192, h, 2048, 576, torch.bfloat16, torch.device("cuda"))
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        fl = flops(4096, h, 2048, 576)
        print(f"h={h}: inputs in {time.time() - t0:.1f}s", flush=True)
        dq = torch.empty_like(x["q"])
        base = default_config(h, 576)

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

        variants = [("default", {})] + [(f"P{c}", c) for c in P_CFGS[1:]] + \
                   [(f"G{c}", c) for c in G_CFGS[h] if c != {k: base[k] for k in c}]
        for name, cfg in variants:
            ms, comp = bench(cfg)
            row = dict(h=h, variant=name, cfg=dict(base, **cfg), ms=ms, tflops=fl / ms / 1e9, first_call_s=comp)
            rows.append(row)
            print(f"h={h} {name:<80} {ms:8.3f} ms {row['tflops']:6.1f} TFLOP/s (first call {comp:.1f}s)",
                  flush=True)
        for scratch in (512 << 20, 8 << 30):
            f = lambda: sparse_mla_bwd_launch(a, x["out"], x["dout"], x["lse"], None, dq, scratch_bytes=scratch)  # noqa
            ms = triton.testing.do_bench(f, warmup=25, rep=150, return_mode="median")
            print(f"h={h} default, scratch {scratch >> 20} MiB: {ms:.3f} ms {fl / ms / 1e9:.1f} TFLOP/s", flush=True)
            rows.append(dict(h=h, variant=f"scratch{scratch >> 20}M", ms=ms, tflops=fl / ms / 1e9))
        ms, _ = bench({}, det=True)
        print(f"h={h} deterministic: {ms:.3f} ms {fl / ms / 1e9:.1f} TFLOP/s", flush=True)
        rows.append(dict(h=h, variant="deterministic", ms=ms, tflops=fl / ms / 1e9))
        # per-kernel split of the default and deterministic modes
        for det in (False, True):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    sparse_mla_bwd_launch(a, x["out"], x["dout"], x["lse"], None, dq, deterministic=det)
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
