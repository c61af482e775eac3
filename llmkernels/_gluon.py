"""Gluon (triton.experimental.gluon, Triton >= 3.5) for the sm_90 kernels; HAVE_GLUON is False without it, and
the ops then use their plain-Triton kernels."""
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:  # pragma: no cover
    gluon = gl = async_copy = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    TensorDescriptor = None
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "gluon", "gl", "async_copy", "fence_async_shared", "mbarrier", "tma", "TensorDescriptor",
           "warpgroup_mma", "warpgroup_mma_wait"]
