import os
import sys

import pytest
import torch

import llmkernels  # noqa: F401  (sets up the Triton interpreter on CPU-only machines before kernels load)

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_make_parametrize_id(config, val, argname):
    """Readable ids for the values pytest would number: dtypes (float16, not dtype0), config dicts, string lists."""
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    if isinstance(val, dict):
        return "-".join(f"{k}={v}" for k, v in val.items()) or "default"
    if isinstance(val, (list, tuple)) and all(isinstance(v, str) for v in val):
        return "+".join(val) or "none"
    return None


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(autouse=True)
def _fresh_seed():
    # fresh random inputs on every run; the seed is printed on failure for reproduction
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"torch.manual_seed({seed})")  # pytest shows captured output of failing tests
    yield seed


# ---- NaN poisoning (after flash-linear-attention's tests/conftest.py) -------------------------------------------
# During every test, floating-point tensors that llmkernels itself allocates with torch.empty / torch.empty_like /
# Tensor.new_empty (op outputs, split-KV partials, split-K partials, backward scratch) come filled with NaN, so an
# element a kernel fails to write shows up as NaN in the result instead of passing on whatever the memory held.
# Allocations made by tests, torch or other libraries are left alone, and nothing is filled while torch.compile traces.
_EMPTY, _EMPTY_LIKE, _NEW_EMPTY = torch.empty, torch.empty_like, torch.Tensor.new_empty


def _from_llmkernels() -> bool:
    return sys._getframe(2).f_globals.get("__name__", "").startswith("llmkernels")


def _poisoned(t):
    if (t.is_floating_point() or t.is_complex()) and not torch.compiler.is_compiling():
        t.fill_(float("nan"))
    return t


def _nan_empty(*args, **kwargs):
    return _poisoned(_EMPTY(*args, **kwargs)) if _from_llmkernels() else _EMPTY(*args, **kwargs)


def _nan_empty_like(*args, **kwargs):
    return _poisoned(_EMPTY_LIKE(*args, **kwargs)) if _from_llmkernels() else _EMPTY_LIKE(*args, **kwargs)


def _nan_new_empty(self, *args, **kwargs):
    return _poisoned(_NEW_EMPTY(self, *args, **kwargs)) if _from_llmkernels() else _NEW_EMPTY(self, *args, **kwargs)


@pytest.fixture(autouse=True)
def _nan_poison(monkeypatch):
    monkeypatch.setattr(torch, "empty", _nan_empty)
    monkeypatch.setattr(torch, "empty_like", _nan_empty_like)
    monkeypatch.setattr(torch.Tensor, "new_empty", _nan_new_empty)
    yield
