"""NVFP4 (E2M1 + e4m3 block scales) GEMV, weight-only linear and format helpers."""
from .op import custom_kernel  # noqa: F401  (GPU MODE nvfp4_gemv entry point)
