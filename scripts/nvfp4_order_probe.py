"""Does timing right after the bf16 GEMM ceiling slow the nvfp4 GEMV? (The harness measures its ceilings first;
the sweeps only the copy rate.) Times the default and static-weights GEMV at (7168, 2048, 4) as the harness does
(graph replay, rotated inputs): first cold, then right after the GEMM ceiling (gemm_rate), then after a 5 s pause; twice."""
import time

import torch

from llmkernels.bench.ceilings import copy_bandwidth, gemm_rate
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv.op import nvfp4_gemv
from llmkernels.ops.nvfp4_gemv.spec import gemv_bytes, make_inputs

M, K, L = 7168, 2048, 4
bw = copy_bandwidth()
floor_us = gemv_bytes(M, K, L) / bw * 1e6
dev = torch.device("cuda")
sets = rotation_sets(gemv_bytes(M, K, L))
xs = [make_inputs(M, K, L, dev) for _ in range(sets)]


def pct(static):
    fns = [lambda x=x: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=static) for x in xs]
    return 100 * floor_us / (_graph_time_ms(fns) * 1e3)


for rnd in range(2):
    print(f"round {rnd}: cold      default {pct(False):5.1f} %  static {pct(True):5.1f} %", flush=True)
    tf = gemm_rate.__wrapped__() / 1e12  # uncached: a fresh 8192^3 bf16 GEMM
    print(f"round {rnd}: after GEMM ({tf:.0f} TFLOP/s) default {pct(False):5.1f} %  static {pct(True):5.1f} %",
          flush=True)
    time.sleep(5)
    print(f"round {rnd}: +5 s      default {pct(False):5.1f} %  static {pct(True):5.1f} %", flush=True)
