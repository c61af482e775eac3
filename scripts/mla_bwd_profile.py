"""One default-mode sparse_mla_bwd call at h_q=128, 512 query rows of the benchmark shape (for ncu)."""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from llmkernels.ops.sparse_mla import spec_bwd  # noqa: E402

x = spec_bwd.make_inputs(512, 8192, 128, 2048, 576, torch.bfloat16, torch.device("cuda"))
x["q_start"] = 8192 - 512
spec_bwd.run(x)
torch.cuda.synchronize()
print("profiled one call")
