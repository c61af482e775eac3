import importlib
import os
import sys

import pytest
import torch

import llmkernels  # noqa: F401  (sets up the Triton interpreter on CPU-only machines before kernels load)

HAS_CUDA = torch.cuda.is_available()

# Optional extras whose tests skip where their packages are missing, except where this variable names the extra
# (.ci/run: LLMKERNELS_REQUIRE_EXTRAS=hf,hf-test): there a missing package fails the run instead.
REQUIRED_EXTRAS = set(filter(None, os.environ.get("LLMKERNELS_REQUIRE_EXTRAS", "").split(",")))
_MISSING = "missing optional package"


def import_extra(module: str, extra: str, pip: str = ""):
    """pytest.importorskip for a package of an optional extra ("hf", "hf-test", or "optional" for one that no extra
    installs: pip names it); the skip is listed at the end of the run, and fails where REQUIRED_EXTRAS names the
    extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        how = pip or f'pip install -e ".[{extra}]"'
        if extra in REQUIRED_EXTRAS:
            pytest.fail(f"{module} is missing but LLMKERNELS_REQUIRE_EXTRAS names [{extra}] ({e}): {how}",
                        pytrace=False)
        pytest.skip(f"{_MISSING} {module} ({how})", allow_module_level=True)


def pytest_terminal_summary(terminalreporter):
    """Say which tests skipped for a missing optional package, rather than counting them among the skipped."""
    reasons = {}
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if _MISSING in reason:
            reasons.setdefault(reason.split("Skipped: ")[-1], set()).add(rep.nodeid.split("::")[0])
    for reason, files in sorted(reasons.items()):
        terminalreporter.write_line(f"skipped, {reason}: {', '.join(sorted(files))}", yellow=True)


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
    # fresh random inputs on every run; the seed is printed on failure, LLMKERNELS_TEST_SEED=<seed> reproduces it
    seed = int(os.environ.get("LLMKERNELS_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
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
