"""quantize_ (nn.Linear -> NVFP4Linear in place) and save_nvfp4 (a ModelOpt or compressed-tensors checkpoint)."""
import fnmatch
import json
import os
import warnings
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
from safetensors.torch import save_file

from .._validate import check_bool, check_int
from ..ops.nvfp4.format import default_global_scale, nvfp4_dequantize, nvfp4_quantize
from ..ops.nvfp4.op import NVFP4Linear
from .fuse import fuse_projections
from .formats import FORMATS, compressed_tensors_config, modelopt_config
from .moe import has_fused_experts, renames, to_checkpoint_name, unfuse_experts


# sibling nn.Linear layers that engines load into one fused layer with ONE global scale (vLLM's qkv_proj,
# gate_up_proj, DeepSeek's fused_qkv_a_proj, MoE w13), so their producers give them one: llm-compressor 0.14
# (observers/helpers.py FUSED_LAYER_NAMES) and ModelOpt 0.47 (preprocess_linear_fusion: the max of the amaxes)
SHARED_SCALE_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa"),
                      ("w1", "w3"))
_X_DTYPES = (torch.float16, torch.bfloat16)  # what NVFP4Linear multiplies


def scale_groups(model: torch.nn.Module, quantized: Iterable[str]) -> List[Tuple[str, ...]]:
    """The full names of each set of SHARED_SCALE_NAMES siblings (all nn.Linear or NVFP4Linear) in model. Raises
    ValueError where `quantized` holds some of a set but not all: a fused loader needs the whole set alike."""
    quantized, groups = set(quantized), []
    for parent_name, parent in model.named_modules():
        for names in SHARED_SCALE_NAMES:
            mods = [getattr(parent, n, None) for n in names]
            if not all(isinstance(m, (torch.nn.Linear, NVFP4Linear)) for m in mods):
                continue
            full = tuple(f"{parent_name}.{n}" if parent_name else n for n in names)
            inside = [n for n in full if n in quantized]
            if inside and len(inside) < len(full):
                raise ValueError(f"{', '.join(full)} share one global scale in NVFP4 checkpoints (engines such as vLLM "
                                 f"load them as one fused layer), but only {', '.join(inside)} would be NVFP4: "
                                 "quantize all of them or none (skip patterns)")
            if inside:
                groups.append(full)
    return groups


def _output_embedding_name(model: torch.nn.Module) -> Optional[str]:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return next((n for n, m in model.named_modules() if m is out), None) if out is not None else None


def quantize_(model: torch.nn.Module, skip: Iterable[str] = (), fuse: bool = True,
              quantize_lm_head: bool = False) -> torch.nn.Module:
    """Replace, in place, every nn.Linear of model by an NVFP4Linear holding its weight quantized with
    llmkernels.nvfp4_quantize (e4m3 scale per 16 values, round to nearest), except the output embedding (lm_head;
    unless quantize_lm_head) and the layers whose names match a pattern of `skip` (fnmatch on whole names:
    "*.mlp.down_proj", "model.layers.0.*"). Quantization runs on the weights' device.

    Global scales: amax / (6 * 448) per layer, except that the q / k / v and gate / up projections of a layer (and
    SHARED_SCALE_NAMES' other sets) share one, from the largest amax of the set, as llm-compressor and ModelOpt
    write them: engines (vLLM) load each set as one fused layer with one global scale. fuse: group the q / k / v
    and gate / up layers of known decoder layers into one kernel call (fuse.fuse_projections). Returns model.

    Raises TypeError for a model that is itself an nn.Linear (use NVFP4Linear.from_linear) or weights that are not
    fp16 / bf16 (NVFP4Linear multiplies fp16 / bf16 activations: cast the model first), and ValueError for a skip
    pattern that matches no nn.Linear, nothing left to quantize, in_features not a multiple of 16, a skip pattern
    that splits a shared-scale set, or quantize_lm_head with an output embedding tied to the input one."""
    check_bool("fuse", fuse)
    check_bool("quantize_lm_head", quantize_lm_head)
    if isinstance(model, (torch.nn.Linear, NVFP4Linear)):
        raise TypeError("quantize_ replaces the nn.Linear layers inside a model; for one layer use "
                        "llmkernels.NVFP4Linear.from_linear(layer)")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    if not all(isinstance(p, str) for p in skip):
        raise TypeError(f"skip must be fnmatch patterns (str), got {skip!r}")
    if has_fused_experts(model):  # MoE: one nn.Linear per expert and projection first (hf.moe)
        unfuse_experts(model, materialize=True)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for p in skip:
        if not any(fnmatch.fnmatchcase(n, p) for n, _ in linears):
            raise ValueError(f"skip pattern {p!r} matches no nn.Linear of the model (patterns match whole names, "
                             f"such as {linears[0][0]!r})" if linears else f"skip pattern {p!r}: model has no "
                             "nn.Linear")
    head = _output_embedding_name(model)
    if quantize_lm_head and head is not None and \
            model.get_output_embeddings().weight is getattr(model.get_input_embeddings(), "weight", None):
        raise ValueError(f"quantize_lm_head: {head} is tied to the input embedding (tie_word_embeddings); it stays "
                         "dense")
    todo = {n: m for n, m in linears if not any(fnmatch.fnmatchcase(n, p) for p in skip)
            and (quantize_lm_head or n != head)}
    if not todo:
        raise ValueError("nothing to quantize: the model has no nn.Linear outside skip and the output embedding"
                         + (" (already quantized?)" if any(isinstance(m, NVFP4Linear) for m in model.modules())
                            else ""))
    for name, mod in todo.items():
        if mod.weight.dtype not in _X_DTYPES:
            raise TypeError(f"{name}.weight is {mod.weight.dtype}; NVFP4Linear multiplies float16 / bfloat16 "
                            "activations: cast the model first (model.to(torch.bfloat16))")
        if mod.in_features % 16:
            raise ValueError(f"{name}: in_features={mod.in_features} is not a multiple of 16, which NVFP4 needs; "
                             f"add {name!r} to skip")
    shared = {}
    with torch.no_grad():
        for group in scale_groups(model, todo):
            amax = torch.stack([todo[n].weight.float().abs().amax().to(todo[group[0]].weight.device) for n in group])
            g = default_global_scale(amax.amax())
            shared.update({n: g for n in group})
        for name, mod in todo.items():
            parent_name, _, leaf = name.rpartition(".")
            g = shared.get(name)
            setattr(model.get_submodule(parent_name), leaf,
                    NVFP4Linear.from_linear(mod, None if g is None else g.to(mod.weight.device)))
    if fuse:
        fuse_projections(model)
    return model


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.bfloat16


def _requantized(mods: List[NVFP4Linear]) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(packed, scales, global scale) of each layer's weight requantized with the set's one global scale (from the
    largest amax of their dequantized weights, exact in fp32)."""
    w = [nvfp4_dequantize(*m.plain_weight(), m.global_scale) for m in mods]
    g = default_global_scale(torch.stack([x.abs().amax().to(w[0].device) for x in w]).amax())
    return [nvfp4_quantize(x, g.to(x.device)) for x in w]


def checkpoint_tensors(model: torch.nn.Module, format: str) -> Dict[str, torch.Tensor]:
    """The model's state as the tensors of an NVFP4 checkpoint in `format` (on their devices; tied tensors once).
    Each set of scale_groups shares one global scale: where the model's layers of a set hold different ones (a
    checkpoint that did not share them, layers quantized one by one), the set is requantized to one (a warning
    names it), which the model itself keeps as it is."""
    fmt = FORMATS[format]
    dtype = _model_dtype(model)
    quant = {n: m for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    plain = {}  # layer name -> (packed, scales, global scale) written instead of the module's own
    for group in scale_groups(model, quant):
        mods = [quant[n] for n in group]
        if len({m.global_scale.float().view(torch.int32).item() for m in mods}) > 1:
            warnings.warn(f"{', '.join(group)} hold different global scales; engines (vLLM) load them as one fused "
                          "layer with one, so the checkpoint holds them requantized to a shared one", stacklevel=3)
            plain.update(zip(group, _requantized(mods)))
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        mod, _, leaf = name.rpartition(".")
        if mod in quant:
            if mod in plain and leaf in ("packed", "scales", "global_scale"):
                t = plain[mod][("packed", "scales", "global_scale").index(leaf)]
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
    pairs = renames(model)
    return {to_checkpoint_name(n, pairs): t for n, t in out.items()}


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
    it), with model.safetensors.index.json when there is more than one. The q / k / v and gate / up sets share
    one global scale (see quantize_ and checkpoint_tensors). Everything is checked before a file is written."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    if not isinstance(model, torch.nn.Module) or not hasattr(getattr(model, "config", None), "to_dict"):
        raise TypeError(f"model must be a transformers model (with a .config), got {type(model).__name__}")
    check_int("max_shard_bytes", max_shard_bytes, lo=1)
    if not any(isinstance(m, NVFP4Linear) for m in model.modules()):
        raise ValueError("model has no NVFP4Linear layer: run llmkernels.hf.quantize_(model) first")
    from .. import __version__
    tensors = checkpoint_tensors(model, format)
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    pairs = renames(model)
    ignore = [to_checkpoint_name(n, pairs) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
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
    shards = _shards(tensors, max_shard_bytes)
    files = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for fn, names in zip(files, shards):
        save_file({n: tensors[n].detach().contiguous().to("cpu", copy=True) for n in names}, os.path.join(path, fn),
                  metadata={"format": "pt"})
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {n: fn for fn, names in zip(files, shards) for n in names}}
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    elif os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        os.remove(os.path.join(path, "model.safetensors.index.json"))
