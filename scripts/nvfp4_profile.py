"""Run the nvfp4 GEMV kernel a few times at one shape, for Nsight Compute on the device, e.g.

    ncu -k regex:_gemv --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy --print-details all \
        python scripts/nvfp4_profile.py

NVFP4_SHAPE "M,K,L" (default 7168,2048,4); NVFP4_STATIC=1 for the static-weights plan. ncu runs each kernel alone
(caches flushed, clocks locked): compare kernels with it, not with the harness's back-to-back timings."""
import os

import torch

from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch, gemv_plan
from llmkernels.ops.nvfp4_gemv.spec import make_inputs

M, K, L = (int(v) for v in os.environ.get("NVFP4_SHAPE", "7168,2048,4").split(","))
dev = torch.device("cuda")
x = make_inputs(M, K, L, dev)
a, b, sa, sb = (x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
plan = gemv_plan(M, K // 16, L, dev, os.environ.get("NVFP4_STATIC") == "1")
for _ in range(4):
    gemv_launch(a, b, sa, sb, x["c"], 1.0, cfg=plan)
torch.cuda.synchronize()
