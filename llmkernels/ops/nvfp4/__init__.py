"""The NVFP4 family (E2M1 codes + e4m3 block scales + a global scale): the format and quantize (format.py), the GEMV
(gemv.py), the weight-only linear on the plain layout (linear.py) and NVFP4Linear's tiled layout (tiled_layout.py,
tiled.py, tiled_prefill.py, prefill_wgmma.py), grouped layers (fused.py) and MoE experts (moe.py); op.py holds the
public functions and the module."""
from .format import from_blocked, nvfp4_dequantize, nvfp4_quantize, to_blocked
from .op import NVFP4Linear, custom_kernel, nvfp4_gemv, nvfp4_linear  # custom_kernel: GPU MODE's entry point

__all__ = ["nvfp4_quantize", "nvfp4_dequantize", "to_blocked", "from_blocked", "nvfp4_gemv", "nvfp4_linear",
           "NVFP4Linear", "custom_kernel"]
