"""NVFP4 (E2M1 + e4m3 block scales) GEMV, weight-only linear and format helpers."""
from .format import from_blocked, nvfp4_dequantize, nvfp4_quantize, to_blocked
from .op import NVFP4Linear, custom_kernel, nvfp4_gemv, nvfp4_linear  # custom_kernel: GPU MODE's entry point

__all__ = ["nvfp4_quantize", "nvfp4_dequantize", "to_blocked", "from_blocked", "nvfp4_gemv", "nvfp4_linear",
           "NVFP4Linear", "custom_kernel"]
