"""The two NVFP4 checkpoint formats: their quantization configs, tensor names and global-scale conventions.

Both store, per quantized nn.Linear of out_features N and in_features K:
  packed   uint8 [N, K/2]            two E2M1 codes per byte, element 2i in the low nibble (as llmkernels)
  scale    float8_e4m3fn [N, K/16]   one block scale per 16 values, plain row-major (as llmkernels)
  global   fp32, one value           ModelOpt `weight_scale_2` multiplies (W = e2m1 * scale * g, as llmkernels);
                                     compressed-tensors `weight_global_scale` divides (W = e2m1 * scale / g)
"""
import fnmatch
import json
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

GROUP_SIZE = 16


@dataclass(frozen=True)
class Format:
    name: str
    packed: str            # tensor suffixes of one quantized module
    scale: str
    global_scale: str
    reciprocal: bool       # the stored global scale is 1 / llmkernels' global_scale
    global_shape: tuple    # the shape the format's own producer writes
    ignored: tuple         # activation-quantization tensors: accepted and ignored (weight-only inference)


MODELOPT = Format("modelopt", "weight", "weight_scale", "weight_scale_2", False, (), ("input_scale",))
COMPRESSED_TENSORS = Format("compressed-tensors", "weight_packed", "weight_scale", "weight_global_scale", True, (1,),
                            ("input_global_scale", "input_scale"))
FORMATS = {f.name: f for f in (MODELOPT, COMPRESSED_TENSORS)}
MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4")
CT_FORMAT = "nvfp4-pack-quantized"
# KV-cache quantization scales (FP8 KV caches): the cache runs in the model's dtype, so they are ignored
KV_SCALES = ("k_scale", "v_scale")


@dataclass(frozen=True)
class QuantSpec:
    """Which nn.Linear modules of a checkpoint are NVFP4 and how their tensors are named."""
    format: Format
    ignore: Tuple[str, ...]    # ModelOpt: fnmatch patterns; compressed-tensors: names, "re:" regexes or class names
    targets: Tuple[str, ...]   # compressed-tensors targets (ModelOpt quantizes every nn.Linear not excluded)

    def is_quantized(self, name: str, module: torch.nn.Module) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return False
        if self.format is MODELOPT:
            return not any(fnmatch.fnmatchcase(name, p) for p in self.ignore)
        return (any(_ct_match(name, module, t) for t in self.targets)
                and not any(_ct_match(name, module, p) for p in self.ignore))


def _ct_match(name: str, module: torch.nn.Module, target: str) -> bool:
    """compressed-tensors' rule: "re:<regex>" (re.match), an exact module name, or a class name in the MRO."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or any(c.__name__ == target for c in type(module).__mro__)


def _need(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {msg}")


def _obj(value, where: str, kind=dict):
    """value if it is a `kind` (a JSON object by default), else a ValueError naming where it was read."""
    names = {dict: "a JSON object", list: "a JSON list"}
    _need(isinstance(value, kind), where, f"expected {names[kind]}, got {type(value).__name__} {str(value)[:60]}")
    return value


def read_json(path: str) -> dict:
    """The JSON object in file `path`; ValueError naming the file for what does not parse or is not an object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    return _obj(data, path)


def _names(q: dict, key: str, where: str) -> list:
    """q[key], a list of strings (or absent / null: [])."""
    v = _obj(q.get(key) or [], f"{where}.{key}", list)
    _need(all(isinstance(x, str) for x in v), f"{where}.{key}", "expected a list of strings")
    return v


def _modelopt_spec(q: dict, where: str) -> QuantSpec:
    algo = q.get("quant_algo")
    _need(algo in MODELOPT_ALGOS, where, f"quant_algo is {algo!r}; llmkernels.hf loads "
          f"{' and '.join(MODELOPT_ALGOS)} (weights E2M1 + e4m3 per 16 + fp32 global scale)")
    gs = q.get("group_size", GROUP_SIZE)
    for name, g in _obj(q.get("config_groups") or {}, f"{where}.config_groups").items():  # newer exports: per group
        at = f"{where}.config_groups.{name}"
        gs = _obj(_obj(g, at).get("weights") or {}, f"{at}.weights").get("group_size", gs)
    _need(gs == GROUP_SIZE, where, f"group_size is {gs!r}; NVFP4 has one scale per {GROUP_SIZE} values")
    ignore = _names(q, "exclude_modules", where) + _names(q, "ignore", where)
    return QuantSpec(MODELOPT, tuple(dict.fromkeys(ignore)), ("Linear",))


def _ct_spec(q: dict, where: str) -> QuantSpec:
    status = q.get("quantization_status", "compressed")
    _need(status == "compressed", where, f"quantization_status is {status!r}; expected 'compressed' "
          "(packed weights)")
    groups = _obj(q.get("config_groups") or {}, f"{where}.config_groups")
    _need(len(groups) > 0, where, "config_groups is empty: no quantized layers are described")
    targets = []
    for gname, g in groups.items():
        at = f"{where}.config_groups.{gname}"
        fmt = _obj(g, at).get("format") or q.get("format")
        _need(fmt == CT_FORMAT, at, f"format is {fmt!r}; llmkernels.hf loads {CT_FORMAT!r}")
        w = _obj(g.get("weights") or {}, f"{at}.weights")
        for key, want in (("num_bits", 4), ("type", "float"), ("group_size", GROUP_SIZE), ("symmetric", True)):
            _need(w.get(key, want) == want, f"{at}.weights", f"{key} is {w.get(key)!r}; NVFP4 needs {want!r}")
        _need(w.get("strategy", "tensor_group") in ("tensor_group", "group"), f"{at}.weights",
              f"strategy is {w.get('strategy')!r}; NVFP4 needs 'tensor_group' (or 'group')")
        sd = w.get("scale_dtype")
        _need(sd in (None, "torch.float8_e4m3fn", "float8_e4m3fn"), f"{at}.weights",
              f"scale_dtype is {sd!r}; NVFP4 block scales are float8_e4m3fn")
        targets += _names(g, "targets", at)
    return QuantSpec(COMPRESSED_TENSORS, tuple(_names(q, "ignore", where)), tuple(dict.fromkeys(targets)))


def read_quant_spec(path: str, config: Optional[dict] = None) -> QuantSpec:
    """The QuantSpec of the checkpoint directory `path` (config.json's quantization_config, else ModelOpt's
    hf_quant_config.json). Raises ValueError naming the file and field for anything but NVFP4 with group size 16."""
    if config is None:
        config = read_json(os.path.join(path, "config.json"))
    q = config.get("quantization_config")
    hf_quant = os.path.join(path, "hf_quant_config.json")
    if q is None and os.path.exists(hf_quant):
        where = "hf_quant_config.json: quantization"
        q = dict(_obj(read_json(hf_quant).get("quantization") or {}, where), quant_method="modelopt")
    else:
        where = "config.json: quantization_config"
        if q is not None:
            _obj(q, where)
    if q is None:
        raise ValueError(f"{path} holds no quantization config (config.json has no quantization_config and there is "
                         "no hf_quant_config.json): not an NVFP4 checkpoint")
    method = q.get("quant_method")
    if method == "modelopt":
        return _modelopt_spec(q, where)
    if method == "compressed-tensors":
        return _ct_spec(q, where)
    raise ValueError(f"{where}: quant_method is {method!r}; llmkernels.hf loads 'modelopt' and 'compressed-tensors'")


def modelopt_config(ignore, producer_version: str) -> Tuple[dict, dict]:
    """(config.json's quantization_config, hf_quant_config.json) for a weight-only NVFP4 export, in the layout of
    ModelOpt 0.47's export_hf_checkpoint."""
    producer = {"name": "llmkernels", "version": producer_version}
    ignore = list(ignore)
    qc = {"config_groups": {"group_0": {"weights": {"dynamic": False, "num_bits": 4, "type": "float",
                                                    "group_size": GROUP_SIZE}, "targets": ["Linear"]}},
          "ignore": ignore, "quant_algo": "W4A16_NVFP4", "producer": producer, "quant_method": "modelopt"}
    hf = {"producer": producer, "quantization": {"quant_algo": "W4A16_NVFP4", "kv_cache_quant_algo": None,
                                                 "group_size": GROUP_SIZE, "exclude_modules": ignore}}
    return qc, hf


def compressed_tensors_config(ignore) -> dict:
    """config.json's quantization_config for compressed-tensors' NVFP4A16 scheme, packed (as its
    ModelCompressor.update_config writes it)."""
    weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": GROUP_SIZE,
               "symmetric": True, "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None,
             "format": CT_FORMAT}
    return {"quant_method": "compressed-tensors", "format": CT_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": list(ignore), "kv_cache_scheme": None,
            "sparsity_config": {}, "transform_config": {}}
