"""patch_attention: the one entry point that routes a transformers model's attention through llmkernels (DSA models
on sparse_mla: hf.dsa; Inkling on inkling_decode: hf.inkling)."""
import types
from typing import List

import torch

from .._validate import check_bool
from . import dsa, inkling

# transformers attention class -> (its llmkernels forward, the per-module set-up: patch_module(name, mod, **options))
_ROUTES = {**{c: (dsa._forward, dsa.patch_module) for c in dsa.KNOWN},
           **{c: (inkling.forward, inkling.patch_module) for c in inkling.KNOWN}}
_ATTRS = ("llmk_indexer_loss", "llmk_loss", "llmk_cache_kw")


def patch_attention(model: torch.nn.Module, indexer_loss: bool = False) -> List[str]:
    """Route every attention module of `model` that llmkernels knows through its kernels; returns the modules'
    names (idempotent: a second call changes nothing and returns the same names). ValueError for a model with no
    such module, or dims the kernels do not take; undo with unpatch_attention.

    - DeepSeek-V3.2 / GLM-5 (DeepseekV32Attention, GlmMoeDsaAttention): absorbed MLA on `sparse_mla`, a latent cache,
      a chunked indexer (hf.dsa). indexer_loss: in training (grad enabled), each layer with an indexer also computes
      the DSA indexer objective of its forward, KL(main attention distribution over the selected keys, summed over
      heads and L1-normalised || softmax of the indexer's scores there), summed over tokens; the indexer's inputs are
      detached, so the loss trains the indexer alone. `indexer_loss(model)` returns the sum over layers of the last
      forward.
    - Inkling (InklingAttention): decode steps on `inkling_decode` (compact relative bias, sliding window read in
      the kernel), prefill on FlexAttention reading the compact bias (hf.inkling); inference only."""
    check_bool("indexer_loss", indexer_loss)
    names = []
    for name, mod in model.named_modules():
        route = _ROUTES.get(type(mod).__name__)
        if route is None:
            continue
        fwd, setup = route
        setup(name, mod, indexer_loss) if fwd is dsa._forward else setup(name, mod)
        mod.forward = types.MethodType(fwd, mod)
        names.append(name)
    if not names:
        raise ValueError(f"patch_attention: {type(model).__name__} has no attention module llmkernels knows "
                         f"(classes {', '.join(_ROUTES)})")
    return names


def unpatch_attention(model: torch.nn.Module) -> List[str]:
    """Restore transformers' own forward of every module patch_attention changed; returns their names."""
    names = []
    fwds = {f for f, _ in _ROUTES.values()}
    for name, mod in model.named_modules():
        if getattr(mod.__dict__.get("forward"), "__func__", None) in fwds:
            del mod.forward
            for a in _ATTRS:
                mod.__dict__.pop(a, None)
            names.append(name)
    return names
