"""A safetensors checkpoint's tensor headers, and the checks a model makes of them before anything is loaded."""
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

import torch
from safetensors import safe_open

from .formats import KV_SCALES, QuantSpec, read_json
from .moe import renames, to_checkpoint_name

# safetensors dtype names (the header's "dtype")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
ST_DTYPES = {"U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F16": torch.float16, "BF16": torch.bfloat16,
             "F32": torch.float32, "F64": torch.float64}


class Checkpoint:
    """The tensors of a checkpoint directory (model.safetensors, or shards listed by model.safetensors.index.json),
    known from their headers alone: name -> (safetensors dtype, shape, file). rename: checkpoint name -> the model's
    name for it (MoE families whose checkpoints spell a block otherwise, hf.moe); `source` maps back."""

    def __init__(self, path: str, rename=None):
        self.path = path
        self.source: Dict[str, str] = {}
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map or \
                    not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError(f"{index} has no weight_map (an object of tensor name -> file name)")
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            weight_map, files = None, ["model.safetensors"]
        else:
            raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
        self.files: Dict[str, List[str]] = {}
        self.meta: Dict[str, Tuple[str, tuple, str]] = {}
        for fn in files:
            full = os.path.join(path, fn)
            if not os.path.exists(full):
                raise FileNotFoundError(f"{fn}, listed in model.safetensors.index.json, is missing from {path}")
            try:
                with safe_open(full, framework="pt") as f:  # reads the header only
                    header = {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in f.keys()}
            except Exception as e:  # safetensors' SafetensorError (truncated, not safetensors), OSError
                raise ValueError(f"{full} is not a readable safetensors file: {type(e).__name__}: {e}") from e
            names = []
            for raw, (dt, shape) in header.items():
                name = rename(raw) if rename is not None else raw
                if name in self.meta:
                    raise ValueError(f"tensor {raw} is stored twice ({self.meta[name][2]} and {fn})")
                self.meta[name], self.source[name] = (dt, shape, fn), raw
                names.append(name)
            self.files[fn] = names
        if weight_map is not None:
            for raw, fn in weight_map.items():
                name = rename(raw) if rename is not None else raw
                if self.meta.get(name, (None, None, fn))[2] != fn:
                    raise ValueError(f"model.safetensors.index.json maps {name} to {fn}, which does not hold it")

    def read(self, name: str, device="cpu") -> torch.Tensor:
        with safe_open(os.path.join(self.path, self.meta[name][2]), framework="pt", device=str(device)) as f:
            return f.get_tensor(self.source[name])


@dataclass
class Plan:
    """What a model takes from a checkpoint: its quantized nn.Linear modules (name -> (N, K, has_bias)) and the
    checkpoint tensors it accepts and ignores."""
    quantized: Dict[str, Tuple[int, int, bool]]
    ignored: Set[str]
    tie_output: bool  # the output embedding is tied to the input embedding and not stored


def _expect(ckpt: Checkpoint, name: str, dtypes, shape, what: str) -> None:
    dt, sh, fn = ckpt.meta[name]
    if dt not in dtypes:
        raise TypeError(f"checkpoint tensor {name} ({fn}) is {dt}; expected {' or '.join(dtypes)} ({what})")
    if shape is not None and sh != tuple(shape):
        raise ValueError(f"checkpoint tensor {name} ({fn}) has shape {list(sh)}; expected {list(shape)} ({what})")


def _output_embedding(model: torch.nn.Module) -> Tuple[str, bool]:
    """(name of the output embedding's weight, whether the config ties it to the input embedding)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {id(m): n for n, m in model.named_modules()}
    out_name = f"{names[id(out)]}.weight" if out is not None and id(out) in names else None
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return out_name, bool(getattr(cfg, "tie_word_embeddings", False))


def plan(model: torch.nn.Module, spec: QuantSpec, ckpt: Checkpoint) -> Plan:
    """Check every tensor header of ckpt against the model (built on the meta device) before any data is read:
    missing or unexpected tensors, dtypes, shapes, K a multiple of 16. Then read the scales (the global ones, and the
    e4m3 block scales) and refuse NaN, inf or negative values. Raises TypeError/ValueError naming the tensor."""
    fmt = spec.format
    quantized, expected = {}, {}
    pairs = renames(model)
    for name, mod in model.named_modules():
        if not spec.is_quantized(to_checkpoint_name(name, pairs), mod):
            continue
        N, K = mod.out_features, mod.in_features
        if K % 16:
            raise ValueError(f"{name}: in_features K={K} is not a multiple of 16, but the quantization config "
                             "marks it NVFP4 (one scale per 16 values)")
        quantized[name] = (N, K, mod.bias is not None)
        expected[f"{name}.{fmt.packed}"] = (("U8",), (N, K // 2), "packed E2M1 codes, uint8 [N, K/2]")
        expected[f"{name}.{fmt.scale}"] = (("F8_E4M3",), (N, K // 16), "block scales, float8_e4m3fn [N, K/16]")
        expected[f"{name}.{fmt.global_scale}"] = (("F32",), None, "global scale, one fp32 value")
        if mod.bias is not None:
            expected[f"{name}.bias"] = (FLOAT_DTYPES, (N,), "bias")
    qprefixes = {f"{n}." for n in quantized}
    for pname, p in model.named_parameters(remove_duplicate=False):
        if pname.rsplit(".", 1)[0] + "." not in qprefixes:
            expected[pname] = (FLOAT_DTYPES, tuple(p.shape), "dense parameter")
    persistent = set(model.state_dict(keep_vars=True))  # buffers saved with the model (a router's score bias)
    for bname, b in model.named_buffers():
        if bname in persistent and bname.rsplit(".", 1)[0] + "." not in qprefixes and b.is_floating_point():
            expected[bname] = (FLOAT_DTYPES, tuple(b.shape), "dense buffer")
    out_name, tied = _output_embedding(model)
    tie_output = tied and out_name in expected and out_name not in ckpt.meta
    ignored = set()
    for name in ckpt.meta:
        if name in expected:
            continue
        mod, _, leaf = name.rpartition(".")
        if (mod in quantized and leaf in fmt.ignored) or leaf in KV_SCALES or leaf == "inv_freq":
            ignored.add(name)
            continue
        hint = ""
        if mod in quantized:
            hint = f" ({mod} is quantized; {fmt.name} names its tensors {fmt.packed}, {fmt.scale}, {fmt.global_scale})"
        elif name.endswith((".weight_packed", ".weight_scale", ".weight_scale_2", ".weight_global_scale")):
            hint = f" ({mod} is not quantized according to the quantization config: excluded, or not an nn.Linear)"
        raise ValueError(f"unexpected tensor {name} in {ckpt.meta[name][2]}{hint}")
    for name in expected:
        if name not in ckpt.meta and not (tie_output and name == out_name):
            raise ValueError(f"checkpoint tensor {name} is missing (expected: {expected[name][2]})")
    for name, (dtypes, shape, what) in expected.items():
        if name in ckpt.meta:
            _expect(ckpt, name, dtypes, shape, what)
    for name in quantized:
        g = f"{name}.{fmt.global_scale}"
        if math.prod(ckpt.meta[g][1]) != 1:
            raise ValueError(f"checkpoint tensor {g} has shape {list(ckpt.meta[g][1])}; expected one value")
        v = float(ckpt.read(g).reshape(()))
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"checkpoint tensor {g} is {v}; a global scale must be finite and positive")
        s = f"{name}.{fmt.scale}"
        bad = _bad_e4m3(ckpt.read(s))
        if bad is not None:
            raise ValueError(f"checkpoint tensor {s} holds {bad[1]} at {bad[0]}; e4m3 block scales must be finite "
                             "and >= 0")
    return Plan(quantized, ignored, tie_output)


def _bad_e4m3(scales: torch.Tensor):
    """(index, 'NaN' | 'a negative value') of the first NaN (0x7f, 0xff) or negative (sign bit, nonzero) e4m3 byte."""
    u = scales.view(torch.uint8)
    bad = ((u & 0x7F) == 0x7F) | (u > 0x80)
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in bad.nonzero()[0])
    return list(idx), "NaN" if (int(u[idx]) & 0x7F) == 0x7F else "a negative value"
