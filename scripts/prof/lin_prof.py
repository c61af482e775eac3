import torch
from llmkernels.ops.nvfp4_gemv.kernel import linear_launch
dev = torch.device("cuda")
N, K, T = 14336, 4096, 1
w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
s = torch.randint(0x08, 0x60, (N, K // 16), dtype=torch.uint8, device=dev)
x = torch.randn(T, K, device=dev).to(torch.bfloat16)
gs = torch.ones(1, device=dev)
y = torch.empty(T, N, dtype=torch.bfloat16, device=dev)
for _ in range(3):
    linear_launch(x, w, s, gs, None, y)
torch.cuda.synchronize()
