"""Programmatic dependent launch (Hopper+): the device-side entry of a kernel launched with it, and where it is on.
Shared by the split-KV ops, their merge and the NVFP4 kernels."""
import os

import torch
import triton
import triton.language as tl

from ._runtime import capability, interpreting


@triton.jit
def pdl_enter(USE_GDC: tl.constexpr, TRIGGER: tl.constexpr = True):
    """Entry of a kernel launched with programmatic dependent launch: wait until the preceding kernel's writes
    are visible (it may still have been running when this grid started), then (TRIGGER) let the next kernel launch
    (it waits for this grid's writes in turn). Split kernels, the merge and nvfp4's split-K reduce all start so. A
    kernel that no merge follows does not trigger: the next call's programs would take SM slots only to wait
    (masked_decode B=32 L=8K, one split, graph replay: 406 us with the trigger, 358 without; notes/host_path.md)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        if TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()


_PDL = os.environ.get("LLMKERNELS_PDL", "1") != "0"  # LLMKERNELS_PDL=0: no programmatic dependent launch (A/B)


def pdl_enabled(device: torch.device) -> bool:
    """Programmatic dependent launch: Hopper+ GPUs only (not the interpreter), unless LLMKERNELS_PDL=0."""
    return _PDL and device.type == "cuda" and not interpreting() and capability(device)[0] >= 9
