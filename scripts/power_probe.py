"""Is the GPU clock-limited by power under our kernels? Runs each workload back to back for a few seconds while
nvidia-smi samples SM clock, power draw and throttle reasons; prints medians next to the workload's rate.
Usage (repo root, PYTHONPATH=.): python scripts/power_probe.py"""
import importlib
import statistics
import subprocess
import time

import torch
import triton

from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

dev = torch.device("cuda")
FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def sample(fn, seconds=4.0):
    fn()
    torch.cuda.synchronize()
    p = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "200"],
                         stdout=subprocess.PIPE, text=True)
    t0, n = time.time(), 0
    ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev[0].record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    ev[1].record()
    torch.cuda.synchronize()
    p.terminate()
    out = p.communicate()[0].strip().splitlines()[3:-1]  # drop the ramp and the tail
    vals = [[x.strip() for x in line.split(",")] for line in out if line.count(",") == 3]
    clk = statistics.median(float(v[0]) for v in vals)
    pw = statistics.median(float(v[1]) for v in vals)
    temp = statistics.median(float(v[2]) for v in vals)
    reasons = sorted({v[3] for v in vals})
    return ev[0].elapsed_time(ev[1]) / n, clk, pw, temp, reasons


def main():
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,power.default_limit,power.max_limit,"
                          "clocks.max.sm,clocks.applications.graphics", "--format=csv"],
                         capture_output=True, text=True).stdout)
    x = make_inputs(4096, 8192, 128, 2048, 576, torch.bfloat16, dev, seed=1)
    a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
    o = (torch.empty(4096, 128, 512, dtype=torch.bfloat16, device=dev), torch.empty(4096, 128, device=dev),
         torch.empty(4096, 128, device=dev))
    flop_fwd = 2 * 4096 * 2048 * 128 * (576 + 512)
    m = 8192
    A = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    B = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    work = [("gemm 8192^3 bf16", lambda: A @ B, 2 * m ** 3)]
    try:
        HF = importlib.import_module("llmkernels.ops._sm_head.fwd_wgmma")
        work.append(("fwd head h128", lambda: HF.sparse_mla_fwd_ws_launch(a, *o), flop_fwd))
    except ImportError:
        pass
    work += [("fwd new h128", lambda: WF.sparse_mla_fwd_ws_launch(a, *o), flop_fwd),
             ("fwd new probe1 h128", lambda: WF.sparse_mla_fwd_ws_launch(a, *o, config=dict(PROBE=1)), flop_fwd)]
    for name, fn, flop in work:
        ms, clk, pw, temp, reasons = sample(fn)
        print(f"{name:<22} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s  sm clock {clk:6.0f} MHz  power {pw:5.0f} W  "
              f"{temp:3.0f} C  throttle {reasons}", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    main()
