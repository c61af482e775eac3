"""Quick start: masked GQA decode checked against its fp32 reference, and on a GPU timed against PyTorch's SDPA.

Runs on whatever the machine has: on a CUDA GPU at a serving-sized shape (a 64K-token cache), elsewhere through the
Triton interpreter on the CPU at a tiny one (seconds).
"""
import torch

import llmkernels  # before triton: on a machine without CUDA it switches triton to its CPU interpreter
from llmkernels.ops.masked_decode.reference import masked_decode_ref

gpu = torch.cuda.is_available()
device = "cuda" if gpu else "cpu"
B, Hq, Hkv, L, D = (4, 32, 8, 65536, 128) if gpu else (2, 8, 2, 512, 64)
q = torch.randn(B, Hq, D, dtype=torch.float16, device=device)
k = torch.randn(B, Hkv, L, D, dtype=torch.float16, device=device)
v = torch.randn_like(k)
drop_mask = torch.rand(B, Hkv, L, device=device) < 0.5  # True drops the token: half the cache is never read

out, lse = llmkernels.masked_decode(q, k, v, drop_mask=drop_mask)
ref, ref_lse = masked_decode_ref(q, k, v, drop_mask=drop_mask)
err = (out.float() - ref).abs().max().item()
lse_err = (lse - ref_lse).abs().max().item()
where = torch.cuda.get_device_name() if gpu else "CPU (Triton interpreter)"
print(f"masked_decode on {where}: B={B} Hq={Hq} Hkv={Hkv} L={L} D={D} fp16, half the tokens dropped")
print(f"max |out - fp32 reference| = {err:.1e}, max |lse - reference| = {lse_err:.1e}")
# |out| <= max |v| ~ 4; fp16 rounds out and the probabilities fed to the tensor cores at ~5e-4 relative
assert err < 1e-2 and lse_err < 1e-3, "llmkernels.masked_decode disagrees with its reference"

if gpu:
    import triton
    keep = (~drop_mask).repeat_interleave(Hq // Hkv, dim=1)[:, :, None, :]  # SDPA's mask: True = attend
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q[:, :, None], k, v, attn_mask=keep, enable_gqa=True)
    ours = triton.testing.do_bench(lambda: llmkernels.masked_decode(q, k, v, drop_mask=drop_mask))
    theirs = triton.testing.do_bench(sdpa)
    print(f"llmkernels {ours * 1e3:.0f} us, torch SDPA with a bool mask {theirs * 1e3:.0f} us "
          f"({theirs / ours:.1f}x); run `llmkernels bench masked_decode` for the full benchmark")
print("ok")
