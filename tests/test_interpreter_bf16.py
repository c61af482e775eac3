"""CPU (Triton interpreter) only: bf16 inputs to kernels that multiply with tl.dot are refused with a clear error,
because the interpreter's bf16 tl.dot returns wrong values in triton 3.6 (the ops would answer garbage)."""
import pytest
import torch

import llmkernels
from llmkernels._runtime import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="the interpreter's bf16 trap only")
BF = torch.bfloat16


def _raises(fn):
    with pytest.raises(TypeError, match="bfloat16"):
        fn()


def test_attention_ops_refuse_bf16_under_interpreter():
    q, k = torch.randn(1, 4, 64, dtype=BF), torch.randn(1, 2, 16, 64, dtype=BF)
    _raises(lambda: llmkernels.masked_decode(q, k, k.clone()))
    kc = torch.randn(2, 16, 2, 64, dtype=BF)  # NHD [num_blocks, block_size, Hkv, D]
    tables, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    _raises(lambda: llmkernels.xl_paged_decode(q[0][None], kc, kc.clone(), tables, lens))
    sq, kv = torch.randn(3, 2, 576, dtype=BF), torch.randn(40, 1, 576, dtype=BF)
    idx = torch.randint(0, 40, (3, 16), dtype=torch.int32)
    lse = torch.zeros(3, 2)
    _raises(lambda: llmkernels.sparse_mla(sq, kv, idx, 0.1))
    _raises(lambda: llmkernels.sparse_mla_attn_dist(sq, kv, idx, lse, 0.1))
    _raises(lambda: llmkernels.indexer_kl_loss(torch.randn(3, 16), sq, kv, idx, lse, 0.1))
    out = torch.randn(3, 2, 512, dtype=BF)
    _raises(lambda: llmkernels.sparse_mla_bwd(sq, kv, out, out.clone(), idx, lse, 0.1))


def test_nvfp4_linear_refuses_bf16_only_on_the_fused_path():
    w = torch.randn(32, 64)
    packed, scales, gs = llmkernels.nvfp4_quantize(w)
    _raises(lambda: llmkernels.nvfp4_linear(torch.randn(4, 64, dtype=BF), packed, scales, gs))
    x = torch.randn(17, 64, dtype=BF)  # T > 16: dequantize (no tl.dot) + torch's matmul, which is right
    y = llmkernels.nvfp4_linear(x, packed, scales, gs)
    ref = x.float() @ llmkernels.nvfp4_dequantize(packed, scales, gs).T
    assert y.dtype == BF and (y.float() - ref).abs().max() <= 0.05 * ref.abs().max()  # bf16 products and output
