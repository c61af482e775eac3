"""DeepSeek-V3.2 top-k sparse MLA: forward, FlashMLA drop-in, attention distribution, indexer KL loss, backward."""
from .autograd import sparse_mla_bwd  # also makes sparse_mla differentiable
from .op import flash_mla_sparse_fwd, indexer_kl_loss, sparse_mla, sparse_mla_attn_dist

__all__ = ["sparse_mla", "flash_mla_sparse_fwd", "sparse_mla_attn_dist", "indexer_kl_loss", "sparse_mla_bwd"]
