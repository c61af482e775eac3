"""How long does the static-weights GEMV at (7168, 2048, 4) take to recover after other work (notes round 10)?
Times it (graph of 64 calls, 20 replays: ~25 ms a measurement) over and over for ~2 s after (a) input generation,
(b) ~1 s of the torch dequant + bmm peer, (c) a 1 s idle pause; prints % of floor and the SM clock (NVML) over time."""
import time

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv.op import nvfp4_gemv
from llmkernels.ops.nvfp4_gemv.spec import _gemv_dequant_torch, gemv_bytes, make_inputs

dev = torch.device("cuda")
bw = copy_bandwidth()
M, K, L = 7168, 2048, 4
floor_us = gemv_bytes(M, K, L) / bw * 1e6
sets = rotation_sets(gemv_bytes(M, K, L))


def clock():
    try:
        return torch.cuda.clock_rate()
    except Exception:  # noqa: BLE001
        return -1


def series(tag, fns, seconds=2.0):
    t0 = time.monotonic()
    out = []
    while time.monotonic() - t0 < seconds:
        out.append((time.monotonic() - t0, 100 * floor_us / (_graph_time_ms(fns, calls=64) * 1e3), clock()))
    print(f"{tag}: " + " ".join(f"{t:.2f}s:{p:.1f}%@{c}" for t, p, c in out[:6]) + " ... " +
          " ".join(f"{t:.2f}s:{p:.1f}%@{c}" for t, p, c in out[-4:]), flush=True)


xs = [make_inputs(M, K, L, dev) for _ in range(sets)]
fns = [lambda x=x: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=True) for x in xs]
series("after input generation", fns)
peer = [_gemv_dequant_torch(x) for x in xs[:2]]
for rnd in range(2):
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.0:
        for p in peer:
            p()
    torch.cuda.synchronize()
    series(f"after 1 s of the dequant peer ({rnd})", fns)
    time.sleep(1.0)
    series(f"after a further 1 s idle ({rnd})", fns, 0.5)
xs2 = [make_inputs(M, K, L, dev) for _ in range(sets)]
fns2 = [lambda x=x: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=True) for x in xs2]
series("fresh inputs again", fns2)
