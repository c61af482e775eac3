"""llmkernels: Triton kernels for LLM attention variants and low-precision GEMV.

Without a CUDA device the kernels run through the Triton interpreter (TRITON_INTERPRET=1 is set on
import unless the variable is already set), which is slow and meant for small shapes and tests.
"""
from ._runtime import setup_interpreter

setup_interpreter()

from .ops.combine import merge_attention_states  # noqa: E402
from .ops.combine.kernel import empty_cache  # noqa: E402
from .ops.dsa_indexer import dsa_index_scores, dsa_topk_logits  # noqa: E402
from .ops.inkling_decode import inkling_decode  # noqa: E402
from .ops.masked_decode import kept_lists, masked_decode  # noqa: E402
from .ops.moe_topk import moe_topk  # noqa: E402
from .ops.row_topk import row_topk  # noqa: E402
from .ops.nvfp4 import (NVFP4Linear, from_blocked, nvfp4_dequantize, nvfp4_gemv, nvfp4_linear,  # noqa: E402
                             nvfp4_quantize, to_blocked)
from .ops.sparse_mla import (flash_mla_sparse_fwd, indexer_kl_loss, sparse_mla, sparse_mla_attn_dist,  # noqa: E402
                             sparse_mla_bwd)
from .ops.xl_paged_decode import xl_paged_decode  # noqa: E402

__all__ = ["masked_decode", "kept_lists", "merge_attention_states", "xl_paged_decode", "nvfp4_quantize",
           "nvfp4_dequantize", "to_blocked", "from_blocked", "nvfp4_gemv", "nvfp4_linear", "NVFP4Linear", "sparse_mla",
           "flash_mla_sparse_fwd", "sparse_mla_attn_dist", "indexer_kl_loss", "sparse_mla_bwd", "dsa_index_scores",
           "dsa_topk_logits", "inkling_decode", "moe_topk", "row_topk", "empty_cache"]
__version__ = "0.1.0"
