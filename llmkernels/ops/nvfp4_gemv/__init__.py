"""Deprecated name of llmkernels.ops.nvfp4 (renamed in issue 48: the package holds the whole NVFP4 family - format,
quantize, GEMV, linear, tiled layout, prefill, grouped layers, MoE - not a GEMV alone). `llmkernels.ops.nvfp4_gemv`
and `llmkernels.ops.nvfp4_gemv.<module>` still import, as the same module objects, with a DeprecationWarning."""
import importlib
import pkgutil
import sys
import warnings

from .. import nvfp4 as _new
from ..nvfp4 import *  # noqa: F401,F403

warnings.warn("llmkernels.ops.nvfp4_gemv is renamed llmkernels.ops.nvfp4", DeprecationWarning, stacklevel=2)
for _m in pkgutil.iter_modules(_new.__path__):
    sys.modules[f"{__name__}.{_m.name}"] = importlib.import_module(f"{_new.__name__}.{_m.name}")
