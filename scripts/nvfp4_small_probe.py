"""Static plan at the short shapes: % of floor against calls per replay, for the shipped table word (opq) or
NVFP4_LUT=imm (notes round 11)."""
import os

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv import kernel as K
from llmkernels.ops.nvfp4_gemv.spec import gemv_bytes, make_inputs
if os.environ.get("NVFP4_LUT") == "imm":
    K.ASM_A, K.ASM_B = K.ASM_A_IMM, K.ASM_B_IMM
bw = copy_bandwidth()
for M, Kd, L in [(4096, 4096, 1), (14336, 4096, 1), (7168, 2048, 4)]:
    nb = gemv_bytes(M, Kd, L)
    sets = rotation_sets(nb)
    xs = [make_inputs(M, Kd, L, torch.device("cuda")) for _ in range(sets)]
    cfg = K.gemv_plan(M, Kd // 16, L, torch.device("cuda"), True)
    fns = [lambda x=x: K.gemv_launch(*[x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")], x["c"], 1.0, cfg=cfg) for x in xs]
    res = [f"{n}:{100 * nb / bw / (_graph_time_ms(fns, calls=n) * 1e-3):.1f}" for n in (sets * 4, 64 // sets * sets, 256 // sets * sets, 1024 // sets * sets)]
    print(os.environ.get("NVFP4_LUT", "opq"), M, Kd, L, sets, "sets", " ".join(res), flush=True)
