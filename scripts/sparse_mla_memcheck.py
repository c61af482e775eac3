"""Run every sparse_mla entry point on small cases with garbage indices (for compute-sanitizer memcheck).

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so each tensor is its own allocation and any read past kv's
rows is outside every allocation, where memcheck sees it.
"""
import torch

from llmkernels import flash_mla_sparse_fwd, indexer_kl_loss, sparse_mla, sparse_mla_attn_dist

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1
dev = torch.device("cuda")
torch.manual_seed(0)
for h_q, d_qk, s_kv in [(3, 576, 37), (64, 576, 50), (128, 512, 41), (200, 576, 33)]:
    s_q, topk = 9, 70
    q = torch.randn(s_q, h_q, d_qk, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, device=dev, dtype=torch.bfloat16)
    garbage = torch.tensor([-1, s_kv, s_kv + 1, I32_MIN, I32_MAX, -7, 1 << 30, s_kv + 1000], dtype=torch.int32)
    idx = torch.randint(0, s_kv, (s_q, topk), dtype=torch.int32)
    pick = torch.rand(s_q, topk) < 0.5
    idx[pick] = garbage[torch.randint(0, len(garbage), (int(pick.sum()),))]
    idx = idx.to(dev)
    tl = torch.tensor([-5, 0, 3, 70, 1000, 69, I32_MAX, I32_MIN, 33], dtype=torch.int32, device=dev)
    qs = torch.tensor([s_kv - s_q], dtype=torch.int32, device=dev)
    sink = torch.randn(h_q, device=dev)
    o, m, lse = sparse_mla(q, kv, idx, 0.05, attn_sink=sink, topk_length=tl, q_start=qs, k_stride=1)
    sparse_mla(q, kv, idx, 0.05, q_start=3, k_stride=4)
    flash_mla_sparse_fwd(q, kv, idx[:, None], 0.05, 512, sink, tl)
    d = sparse_mla_attn_dist(q, kv, idx, lse, 0.05, q_start=qs, topk_length=tl)
    logits = torch.randn(s_q, topk, device=dev, requires_grad=True)
    indexer_kl_loss(logits, q, kv, idx, lse, 0.05, q_start=qs, topk_length=tl).backward()
    torch.cuda.synchronize()
    assert not o.isnan().any() and not d.isnan().any() and not logits.grad.isnan().any()
    print(f"memcheck case h_q={h_q} d_qk={d_qk} s_kv={s_kv}: done", flush=True)
print("all memcheck cases ran")
