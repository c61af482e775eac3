"""NVFP4 checkpoints in Hugging Face transformers: load (ModelOpt, compressed-tensors), quantize, save, decode.

Needs the `hf` extra (transformers, safetensors): from a clone, pip install -e ".[hf]".
"""
try:
    import safetensors  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"llmkernels.hf needs transformers and safetensors ({e}): from a clone of llmkernels, "
                      "pip install -e \".[hf]\"") from e

from .decode import StaticDecoder  # noqa: E402
from .dsa import indexer_loss  # noqa: E402
from .load import load_nvfp4  # noqa: E402
from .patch import patch_attention, unpatch_attention  # noqa: E402
from .save import quantize_, save_nvfp4  # noqa: E402

__all__ = ["load_nvfp4", "quantize_", "save_nvfp4", "StaticDecoder", "patch_attention", "unpatch_attention",
           "indexer_loss"]
