"""llmkernels: Triton kernels for LLM attention variants and low-precision GEMV.

Without a CUDA device the kernels run through the Triton interpreter (TRITON_INTERPRET=1 is set on
import unless the variable is already set), which is slow and meant for small shapes and tests.
"""
from ._runtime import setup_interpreter

setup_interpreter()

from .ops.combine.op import merge_attention_states  # noqa: E402
from .ops.masked_decode.op import masked_decode  # noqa: E402
from .ops.xl_paged_decode.op import xl_paged_decode  # noqa: E402

__all__ = ["masked_decode", "merge_attention_states", "xl_paged_decode"]
__version__ = "0.1.0"
