"""One forward and one default-mode backward call at h_q=128, 512 query rows of the benchmark shape (for ncu):
    ncu --clock-control none --kernel-name regex:"_fwd_see_kernel|_probs_ws_kernel|_grads_kernel" \
        --section SpeedOfLight --section WarpStateStats python scripts/sparse_mla_profile.py"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from llmkernels import sparse_mla  # noqa: E402
from llmkernels.ops.sparse_mla import spec_bwd  # noqa: E402

x = spec_bwd.make_inputs(512, 8192, 128, 2048, 576, torch.bfloat16, torch.device("cuda"))
sparse_mla(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
spec_bwd.run(x)
torch.cuda.synchronize()
print("profiled one forward and one backward call")
