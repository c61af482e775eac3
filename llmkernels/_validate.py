"""Argument checks shared by every op: each raises a ValueError/TypeError naming the argument."""
from typing import Iterable, Optional, Sequence

import torch

from ._runtime import interpreting


def check_tensor(name: str, t, *, dtypes: Optional[Iterable[torch.dtype]] = None, ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dims, got shape {tuple(t.shape)}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int], what: str = "") -> None:
    if tuple(t.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(expected)}{extra}, got {tuple(t.shape)}")


def check_same_device(kernel: bool = True, **tensors) -> None:
    """All tensors on one device; with kernel=True also one the Triton kernels run on: CUDA (CPU only under
    the interpreter). Pure-torch functions (e.g. format conversions) pass kernel=False."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    if not items:
        return
    n0, t0 = items[0]
    for n, t in items[1:]:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device} but {n0} is on {t0.device}; all tensors must be on one device")
    if kernel and t0.device.type != "cuda" and not interpreting():
        raise ValueError(f"{n0} is on {t0.device}, but the kernels run on CUDA devices (CPU tensors only under the "
                         f"Triton interpreter, TRITON_INTERPRET=1)")


def check_interpreter_dtype(**tensors) -> None:
    """Refuse bf16 under the Triton interpreter (the CPU path): its tl.dot on bf16 operands returns wrong values in
    triton 3.6 (errors of 1e8 and more), so these kernels would answer garbage rather than fail."""
    if not interpreting():
        return
    for n, t in tensors.items():
        if t is not None and t.dtype == torch.bfloat16:
            raise TypeError(f"{n} is bfloat16, which the Triton interpreter (CPU, no CUDA device) multiplies wrongly "
                            f"in tl.dot; use float16 on the CPU, or run on a CUDA GPU")


def check_no_self_overlap(name: str, t: torch.Tensor) -> None:
    """An output written element by element must not alias itself (expand, as_strided): each dim's stride must step
    past everything the smaller-stride dims span (conservative: such a layout never overlaps)."""
    reach = 0
    for st, n in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if st <= reach:
            raise ValueError(f"{name} must not overlap itself (shape {tuple(t.shape)}, strides {t.stride()}): "
                             f"each element is written once")
        reach += st * (n - 1)


def check_unit_last_stride(name: str, t: torch.Tensor) -> None:
    if t.numel() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit stride in its last dim, got strides {tuple(t.stride())}")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value}")


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_int(name: str, value, *, lo=None, hi=None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def check_scale(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not (value == value) or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
