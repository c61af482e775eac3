"""Compile Triton / Gluon kernels for sm_90 on a machine WITHOUT a GPU (used by sass_dump.py).

Importing this module installs a stand-in Triton driver that answers 'sm_90', so the real JIT specialisation
(divisibility, unit strides) is used and nothing is launched. `compile_only(captured)` turns every later launch (of
a host launcher called on CPU stand-in tensors) into a compile for sm_90 and collects the compiled kernels;
`sass(k)` disassembles one.
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _FakeDriver(CudaDriver):
    def __init__(self):  # no libcuda here: skip the real init
        pass

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


driver.set_active(_FakeDriver())
BINDIR = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")


def compile_only(captured: list):
    """From now on every kernel launch compiles for sm_90 instead of running, and appends (kernel name, compiled
    kernel) to captured, in launch order."""
    orig = JITFunction.run

    def run(self, *a, grid, warmup, **kw):
        k = orig(self, *a, grid=grid, warmup=True, **kw)
        captured.append((self.__name__, k))
        return k
    JITFunction.run = run


def sass(k):
    """(SASS text, resource-usage text) of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out = subprocess.run([f"{BINDIR}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([f"{BINDIR}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    return out, res


def regs_stack(res):
    regs, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    return (regs.group(1) if regs else "?"), (stack.group(1) if stack else "?")
