"""Where kernels run: a CUDA GPU, or (no GPU) the Triton interpreter on the CPU."""
import functools
import os
import sys
import warnings

import torch


def setup_interpreter() -> bool:
    """Route Triton kernels through the interpreter when no CUDA device exists.

    Must run before any ``@triton.jit`` function is defined, because Triton picks
    the interpreter at decoration time. Returns True when the interpreter is on.
    """
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        if "triton.language" in sys.modules:  # its own @jit helpers (tl.zeros, ...) were built for the compiler
            warnings.warn("triton was imported before llmkernels on a machine without CUDA: kernels will fail under "
                          "the interpreter. Import llmkernels first, or set TRITON_INTERPRET=1 before starting "
                          "Python.", RuntimeWarning, stacklevel=3)
        os.environ["TRITON_INTERPRET"] = "1"
    _INTERP[:] = [os.environ.get("TRITON_INTERPRET", "0") == "1"]  # fixed from here on, as Triton's choice is
    if interpreting():
        _fix_interpreter_index()
    return interpreting()


def _fix_interpreter_index() -> None:
    """Let the interpreter use a loaded scalar as a loop bound under numpy >= 2.4.

    The interpreter keeps scalars as 1-element arrays and converts them with int(array), which
    numpy 2.4 turned from a deprecation into a TypeError; data-dependent loop bounds (per-sequence
    lengths, top-k lengths) then fail on the CPU only.
    """
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_tensor
    if getattr(orig, "_llmkernels_fix", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._llmkernels_fix = True
    interpreter._patch_lang_tensor = patched


_INTERP = []  # set by setup_interpreter (reading the environment costs ~1.5 us, and launch paths ask often)


def interpreting() -> bool:
    return _INTERP[0] if _INTERP else os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple:
    return torch.cuda.get_device_capability(device_index)


def capability(device: torch.device) -> tuple:
    """A CUDA device's compute capability (cached: the query costs microseconds on every launch otherwise)."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (a small stand-in under the interpreter, to keep grids tiny)."""
    if device.type != "cuda":
        return 4
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


def planned_sms(nsm, device: torch.device) -> int:
    """The SM count a planner plans for: a config's NSM stand-in (tests: an H100's 132 on any machine), else the
    device's."""
    if nsm is None:
        return num_sms(device)
    if type(nsm) is not int or nsm < 1:
        raise ValueError(f"NSM (={nsm!r}) must be a positive int or None")
    return nsm


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host (triton.cdiv is a constexpr_function: ~5 us a call outside a kernel)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def capturing(device: torch.device) -> bool:
    """The current stream of `device` is capturing a CUDA graph."""
    return device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing()


def capture_step(step) -> "torch.cuda.CUDAGraph":
    """One eager call of step() on a side stream (it compiles the kernels, and it is this call's work), then a CUDA
    graph of step() for the next calls to replay (a decode step whose positions advance on the device)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g
