"""Why does the harness read the static-weights GEMV lower than the sweep on the same machine (84 vs 90 % at
(7168, 2048, 4), notes round 10)? Times it several ways in one process, interleaved, twice:
  op64 / op32: the public op (the harness's call) in graphs of 64 / 32 calls; raw32: gemv_launch on uint8 views (the
  sweep's call); each on the same inputs, then op64 right after the torch dequant + bmm peer has run for ~1 s."""
import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch
from llmkernels.ops.nvfp4_gemv.op import nvfp4_gemv
from llmkernels.ops.nvfp4_gemv.spec import _gemv_dequant_torch, gemv_bytes, make_inputs

dev = torch.device("cuda")
bw = copy_bandwidth()
for M, K, L in ((7168, 2048, 4), (7168, 16384, 1)):
    floor_us = gemv_bytes(M, K, L) / bw * 1e6
    sets = rotation_sets(gemv_bytes(M, K, L))
    xs = [make_inputs(M, K, L, dev) for _ in range(sets)]
    op = [lambda x=x: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=True) for x in xs]
    raw = [lambda x=x: gemv_launch(*(x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")), x["c"], 1.0,
                                   static_weights=True) for x in xs]
    peer = [_gemv_dequant_torch(x) for x in xs[:2]]

    def pct(fns, calls=None):
        return 100 * floor_us / (_graph_time_ms(fns, calls=calls) * 1e3)

    for rnd in range(2):
        row = dict(op64=pct(op), op32=pct(op, 32), raw32=pct(raw, 32), raw64=pct(raw, 64))
        for _ in range(int(1000 / 0.7 / len(peer))):  # ~1 s of the peer
            for p in peer:
                p()
        row["op64 after peer"] = pct(op)
        print(f"{M}x{K}x{L} round {rnd}: " + "  ".join(f"{k} {v:5.1f} %" for k, v in row.items()), flush=True)
