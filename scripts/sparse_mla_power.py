"""How much of the sparse MLA forward's record is the card's power cap? Three ways of timing the same calls:
  sustained : back to back for a few seconds, nvidia-smi sampling SM clock, power and throttle reasons (power_probe);
  harness   : triton do_bench median (256 MB L2 flush between calls), as `llmkernels bench` times the records;
  chill     : FlashMLA's / DeepGEMM's timing (their bench_kineto): every call after an L2 flush by an 8 GB memset,
              which leaves the card a few ms of lighter load before each call; events around the call alone.
Workloads: the bf16 GEMM ceiling (8192^3), the forward at the record shape (h_q 128 and 64), and its two probes
(PROBE=1: consumers alone, no gathers; PROBE=2: producer alone). Rates are TFLOP/s of the forward's formula.
Usage (repo root, PYTHONPATH=.): python scripts/sparse_mla_power.py [128] [64] [--seconds S]"""
import statistics
import subprocess
import sys

import torch
import triton

from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

sys.path.insert(0, "scripts")
from power_probe import sample  # noqa: E402

dev = torch.device("cuda")


def chill(fn, flush, n=30):
    """FlashMLA's timing: flush (8 GB memset), then the call between two events; median over n calls."""
    ts = []
    for _ in range(n + 1):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts[1:])


def main():
    args = sys.argv[1:]
    secs = 4.0
    if "--seconds" in args:
        k = args.index("--seconds")
        secs = float(args[k + 1])
        del args[k:k + 2]
    hs = [int(x) for x in args] or [128, 64]
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm", "--format=csv"],
                         capture_output=True, text=True).stdout, flush=True)
    m = 8192
    A = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    B = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    work = [("gemm 8192^3", 2 * m ** 3, lambda: A @ B)]
    for h in hs:
        x = make_inputs(4096, 8192, h, 2048, 576, torch.bfloat16, dev, seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        o = (torch.empty(4096, h, 512, dtype=torch.bfloat16, device=dev), torch.empty(4096, h, device=dev),
             torch.empty(4096, h, device=dev))
        flop = 2 * 4096 * 2048 * h * (576 + 512)
        for name, cfg in (("fwd", None), ("probe1 consumers", dict(PROBE=1)), ("probe2 producer", dict(PROBE=2))):
            work.append((f"{name} h{h}", flop, lambda a=a, o=o, cfg=cfg: WF.sparse_mla_fwd_ws_launch(a, *o,
                                                                                                  config=cfg)))
    flush = torch.empty(int(8e9) // 4, dtype=torch.int32, device=dev)
    rows = []
    for name, flop, fn in work:
        fn()
        torch.cuda.synchronize()
        ms_s, clk, pw, temp, why = sample(fn, secs)
        ms_h = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        ms_c = chill(fn, flush)
        r = [flop / ms / 1e9 for ms in (ms_s, ms_h, ms_c)]
        rows.append((name, *r, clk, pw, temp, why))
        print(f"{name:<24} sustained {r[0]:6.1f}  harness {r[1]:6.1f}  chill {r[2]:6.1f} TFLOP/s   sustained: "
              f"{clk:5.0f} MHz {pw:4.0f} W {temp:3.0f} C throttle {why}", flush=True)
    # the chill figure's clock: sample while the chill loop runs (fwd at the first h_q)
    name, flop, fn = work[1]
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
    ms_c = chill(fn, flush, 120)
    p.terminate()
    vals = [[float(v) for v in ln.split(",")] for ln in p.communicate()[0].strip().splitlines()[3:-1]
            if ln.count(",") == 1]
    print(f"{name} chill x120: {flop / ms_c / 1e9:6.1f} TFLOP/s; clock samples (MHz) min / median / max "
          f"{min(v[0] for v in vals):.0f} / {statistics.median(v[0] for v in vals):.0f} / "
          f"{max(v[0] for v in vals):.0f}, power median {statistics.median(v[1] for v in vals):.0f} W", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    main()
