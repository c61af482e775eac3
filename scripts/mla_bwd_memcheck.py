"""Small sparse_mla_bwd calls with garbage indices, for `compute-sanitizer --tool memcheck` on the GPU.

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is its own allocation (exact bounds).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
sys.path.insert(0, os.getcwd())
from test_sparse_mla_bwd import grads, make  # noqa: E402

# topk 150: Gluon first pass + Triton second pass; topk 160 (a multiple of 16, h_q > 32): both Gluon passes
for h, d, topk, opts in [(128, 576, 150, dict(q_start=torch.tensor([300], dtype=torch.int32, device="cuda"),
                                              tlen=True, sink=True)),
                         (16, 512, 150, dict(q_start=250, k_stride=4)), (5, 576, 150, dict()),
                         (128, 576, 160, dict(q_start=309, tlen=True)), (64, 576, 160, dict(q_start=309)),
                         (64, 512, 160, dict())]:
    x = make(24, 333, h, topk, d, torch.bfloat16, torch.device("cuda"), **opts)
    for det in (False, True):
        g = grads(x, det)
        torch.cuda.synchronize()
        print(f"h={h} d={d} topk={topk} det={det}: finite={all(torch.isfinite(t).all().item() for t in g)}")
