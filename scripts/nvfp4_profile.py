"""Run the nvfp4 GEMV kernels a few times each at one shape, for Nsight Compute.

Usage (device): ncu -k regex:_gemv --launch-skip 2 --launch-count 1 --section ... python scripts/nvfp4_profile.py
KIND in {old, old-static, mma} picks the kernel (env NVFP4_KIND; default mma), NVFP4_CFG a python dict for the
mma config (default mma_plan), NVFP4_SHAPE "M,K,L" (default 7168,2048,4)."""
import ast
import os

import torch

from llmkernels.ops.nvfp4_gemv import gemv_mma
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch, gemv_plan
from llmkernels.ops.nvfp4_gemv.spec import make_inputs

M, K, L = (int(v) for v in os.environ.get("NVFP4_SHAPE", "7168,2048,4").split(","))
kind = os.environ.get("NVFP4_KIND", "mma")
dev = torch.device("cuda")
x = make_inputs(M, K, L, dev)
a, b, sa, sb = (x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
for _ in range(4):
    if kind.startswith("old"):
        gemv_launch(a, b, sa, sb, x["c"], 1.0, cfg=gemv_plan(M, K // 16, L, dev, kind == "old-static"))
    else:
        cfg = ast.literal_eval(os.environ["NVFP4_CFG"]) if "NVFP4_CFG" in os.environ else None
        gemv_mma.launch_gemv(a, b, sa, sb, x["c"], 1.0, cfg=cfg)
torch.cuda.synchronize()
