"""Does the placement of the inputs in memory move the static-weights GEMV at (7168, 2048, 4) (notes round 10: the
harness read 84.2 % where the sweep read 89.8 % on the same machine)? Eight times: fresh inputs (as the harness makes
per impl), then default and static timed twice each (graph of 64 calls, as the harness)."""
import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv.op import nvfp4_gemv
from llmkernels.ops.nvfp4_gemv.spec import gemv_bytes, make_inputs

dev = torch.device("cuda")
bw = copy_bandwidth()
for M, K, L in ((7168, 2048, 4), (7168, 16384, 1)):
    floor_us = gemv_bytes(M, K, L) / bw * 1e6
    sets = rotation_sets(gemv_bytes(M, K, L))
    for i in range(8):
        xs = [make_inputs(M, K, L, dev) for _ in range(sets)]
        res = []
        for static in (False, True, False, True):
            fns = [lambda x=x: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=static)
                   for x in xs]
            res.append(100 * floor_us / (_graph_time_ms(fns) * 1e3))
        a0 = xs[0]["a"].data_ptr()
        print(f"{M}x{K}x{L} alloc {i} (a at {a0 >> 20} MiB): default {res[0]:5.1f} / {res[2]:5.1f} %  "
              f"static {res[1]:5.1f} / {res[3]:5.1f} %", flush=True)
        del xs, fns
