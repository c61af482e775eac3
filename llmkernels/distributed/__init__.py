"""llmkernels across GPUs, on torch.distributed (NCCL on GPUs, gloo on CPUs): context-parallel decode (the KV
cache split along the sequence) and tensor-parallel sparse MLA (heads split). See docs/distributed.md."""
from .decode import context_parallel_decode, context_parallel_xl_paged_decode
from .tp_sparse_mla import tp_indexer_kl_loss, tp_sparse_mla, tp_sparse_mla_attn_dist, tp_sparse_mla_bwd

__all__ = ["context_parallel_decode", "context_parallel_xl_paged_decode", "tp_sparse_mla", "tp_sparse_mla_bwd",
           "tp_sparse_mla_attn_dist", "tp_indexer_kl_loss"]
