"""quantize_ (nn.Linear -> NVFP4Linear in place) and save_nvfp4 (a ModelOpt or compressed-tensors checkpoint)."""
import fnmatch
import json
import os
from typing import Dict, Iterable, List, Union

import torch
from safetensors.torch import save_file

from .._validate import check_bool
from ..ops.nvfp4_gemv.op import NVFP4Linear
from .fuse import fuse_projections
from .formats import FORMATS, compressed_tensors_config, modelopt_config


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in skip)


def quantize_(model: torch.nn.Module, skip: Iterable[str] = ("lm_head",), fuse: bool = True) -> torch.nn.Module:
    """Replace, in place, every nn.Linear of model whose name matches no pattern of `skip` (fnmatch: "lm_head",
    "*.mlp.gate", ...) by an NVFP4Linear holding its weight quantized with llmkernels.nvfp4_quantize (per-tensor
    global scale amax / (6 * 448), e4m3 scale per 16 values, round to nearest). Quantization runs on the weight's
    device. A layer whose in_features is not a multiple of 16 raises ValueError (add it to `skip`). fuse: group
    the q / k / v and gate / up layers of known decoder layers (fuse.fuse_projections). Returns model."""
    check_bool("fuse", fuse)
    if isinstance(skip, str):
        skip = (skip,)
    skip = tuple(skip)
    todo = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not _skipped(n, skip)]
    for name, mod in todo:
        if mod.in_features % 16:
            raise ValueError(f"{name}: in_features={mod.in_features} is not a multiple of 16, which NVFP4 needs; "
                             f"add {name!r} to skip")
    for name, mod in todo:
        parent_name, _, leaf = name.rpartition(".")
        with torch.no_grad():
            setattr(model.get_submodule(parent_name), leaf, NVFP4Linear.from_linear(mod))
    if fuse:
        fuse_projections(model)
    return model


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.bfloat16


def checkpoint_tensors(model: torch.nn.Module, format: str) -> Dict[str, torch.Tensor]:
    """The model's state as the tensors of an NVFP4 checkpoint in `format` (on their devices; tied tensors once)."""
    fmt = FORMATS[format]
    dtype = _model_dtype(model)
    quant = {n: m for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        mod, _, leaf = name.rpartition(".")
        if mod in quant:
            if leaf == "packed":
                out[f"{mod}.{fmt.packed}"] = t
            elif leaf == "scales":
                out[f"{mod}.{fmt.scale}"] = t
            elif leaf == "global_scale":
                g = t.to(torch.float32).reshape(fmt.global_shape)
                out[f"{mod}.{fmt.global_scale}"] = 1.0 / g if fmt.reciprocal else g.clone()
            else:  # the fp32 bias, written in the model's dtype like every other dense tensor
                out[name] = t.to(dtype)
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else None
        if key is not None and key in seen:  # a tied weight (lm_head = embed_tokens): stored once
            continue
        seen.add(key)
        out[name] = t
    return out


def _shards(tensors: Dict[str, torch.Tensor], max_bytes: int) -> List[List[str]]:
    shards, cur, size = [], [], 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if cur and size + n > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += n
    return shards + [cur] if cur else shards


def save_nvfp4(model: torch.nn.Module, path: Union[str, os.PathLike], format: str = "modelopt",
               max_shard_bytes: int = 5 * 2 ** 30) -> None:
    """Write model (whose NVFP4Linear layers come from quantize_ or load_nvfp4) as an NVFP4 checkpoint in
    `format`: "modelopt" (config.json with quant_method "modelopt" + hf_quant_config.json, quant_algo W4A16_NVFP4)
    or "compressed-tensors" (nvfp4-pack-quantized, NVFP4A16 scheme). Every nn.Linear that is not an NVFP4Linear is
    listed as excluded / ignored. Tensors go to safetensors shards of at most max_shard_bytes (one tensor may exceed
    it), with model.safetensors.index.json when there is more than one."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    if not any(isinstance(m, NVFP4Linear) for m in model.modules()):
        raise ValueError("model has no NVFP4Linear layer: run llmkernels.hf.quantize_(model) first")
    from .. import __version__
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    ignore = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    cfg = model.config.to_dict()
    cfg["dtype"] = str(_model_dtype(model)).replace("torch.", "")
    cfg.pop("torch_dtype", None)
    if format == "modelopt":
        cfg["quantization_config"], hf_quant = modelopt_config(ignore, __version__)
        with open(os.path.join(path, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant, f, indent=2)
    else:
        cfg["quantization_config"] = compressed_tensors_config(ignore)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    tensors = checkpoint_tensors(model, format)
    shards = _shards(tensors, max_shard_bytes)
    files = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for fn, names in zip(files, shards):
        save_file({n: tensors[n].detach().contiguous().cpu() for n in names}, os.path.join(path, fn),
                  metadata={"format": "pt"})
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {n: fn for fn, names in zip(files, shards) for n in names}}
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    elif os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        os.remove(os.path.join(path, "model.safetensors.index.json"))
