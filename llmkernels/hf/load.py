"""load_nvfp4: a transformers model from an NVFP4 checkpoint, its quantized linears as NVFP4Linear."""
import contextlib
import os
from typing import Dict, Tuple, Union

import torch
from safetensors import safe_open

from .._runtime import interpreting
from .._validate import check_bool
from ..ops.nvfp4.op import NVFP4Linear
from ..ops.nvfp4.tiled_layout import tile_packed, tile_scales
from .checkpoint import Checkpoint, plan
from .formats import read_json, read_quant_spec
from .fuse import fuse_projections
from .moe import from_checkpoint_name, renames, unfuse_experts


@contextlib.contextmanager
def params_on_meta():
    """Build modules with their parameters on the meta device (no memory, no initialisation cost) and their buffers
    (rotary inv_freq, ...) real on the CPU, as accelerate's init_empty_weights(include_buffers=False) does."""
    orig = torch.nn.Module.register_parameter

    def register(self, name, param):
        orig(self, name, param)
        if param is not None and param.device.type != "meta":
            p = self._parameters[name]
            self._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig


def set_tensor(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Put value in place of the parameter or buffer `name` (a parameter stays a frozen nn.Parameter)."""
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    if leaf in mod._parameters:
        mod._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    else:
        setattr(mod, leaf, value)


def replace_linears(model: torch.nn.Module, shapes: Dict[str, Tuple[int, int, bool]]) -> None:
    """Swap the named nn.Linear modules for NVFP4Linear ones whose buffers are on the meta device (to be filled)."""
    for name, (N, K, bias) in shapes.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, leaf, NVFP4Linear(K, N, bias=bias, device="meta"))


def buffers_to(model: torch.nn.Module, device) -> None:
    """Move every real (non-meta) buffer to device, keeping its dtype."""
    for mod in model.modules():
        for n, b in mod._buffers.items():
            if b is not None and b.device.type != "meta":
                mod._buffers[n] = b.to(device)


def check_materialized(model: torch.nn.Module) -> None:
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"{len(left)} tensors were not loaded, e.g. {left[:3]}")


def tie_output_embedding(model: torch.nn.Module) -> None:
    model.get_output_embeddings().weight = model.get_input_embeddings().weight


def load_nvfp4(path: Union[str, os.PathLike], device: Union[str, torch.device] = "cuda",
               dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa", fuse: bool = True):
    """A transformers causal LM from the NVFP4 checkpoint directory `path` (ModelOpt or compressed-tensors
    nvfp4-pack-quantized), its quantized nn.Linear layers replaced by llmkernels.NVFP4Linear.

    Every other parameter is cast to `dtype` (float16 or bfloat16: NVFP4Linear's activations; on a CPU without
    CUDA, where the kernels run through the Triton interpreter, float16); NVFP4Linear keeps its bias in fp32. The
    model is built on the meta device and each checkpoint tensor is read once, straight onto `device`: no dense
    copy of a quantized weight is ever made. The files (JSON, safetensors headers: names, dtypes, shapes) and all
    scales are checked before any weight is loaded; problems raise ValueError / TypeError naming the file or tensor.
    Activation-quantization tensors (input_scale, input_global_scale) and KV-cache scales are ignored: inference is
    weight-only, activations stay in `dtype`.
    fuse: group the q / k / v and gate / up layers of known decoder layers (one kernel call each at decode; see
    fuse.fuse_projections). Mixture-of-experts models (Qwen2-MoE, Qwen3-MoE, Mixtral): the per-expert NVFP4 tensors
    load into an hf.moe.Experts list of per-expert NVFP4Linear layers in place of transformers' fused experts.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path must be a checkpoint directory (config.json + safetensors), got {path!r}")
    check_bool("fuse", fuse)
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16 (NVFP4Linear's activations), got {dtype!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {str(device)!r} but CUDA is not available here: pass device='cpu' (and "
                         "dtype=torch.float16; the kernels then run through the Triton interpreter, slowly)")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be a CUDA device or 'cpu', got {str(device)!r}")
    if device.type == "cpu" and dtype == torch.bfloat16 and interpreting():
        raise TypeError("dtype=torch.bfloat16 on the CPU: NVFP4Linear runs through the Triton interpreter there, "
                        "which multiplies bf16 wrongly; pass dtype=torch.float16")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path} has no config.json: not a transformers checkpoint directory")
    spec = read_quant_spec(path, read_json(config_file))
    config = AutoConfig.from_pretrained(path)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    unfuse_experts(model, materialize=False)  # MoE: per-expert linears under the checkpoint's names (hf.moe)
    pairs = renames(model)
    ckpt = Checkpoint(path, rename=lambda n: from_checkpoint_name(n, pairs))
    p = plan(model, spec, ckpt)  # every check before any weight is read
    replace_linears(model, p.quantized)
    buffers_to(model, device)
    fmt = spec.format
    for fn, names in ckpt.files.items():
        with safe_open(os.path.join(path, fn), framework="pt", device=str(device)) as f:
            for name in names:
                if name in p.ignored:
                    continue
                mod, _, leaf = name.rpartition(".")
                t = f.get_tensor(ckpt.source[name])
                if mod not in p.quantized:  # a buffer keeps its own dtype (an fp32 router bias)
                    buf = model.get_submodule(mod)._buffers.get(leaf) if mod else None
                    set_tensor(model, name, t.to(buf.dtype if buf is not None else dtype))
                elif leaf == fmt.packed:  # in the module's layout (NVFP4Linear: tiled where its shape allows)
                    set_tensor(model, f"{mod}.packed", tile_packed(t) if model.get_submodule(mod).tiled else t)
                elif leaf == fmt.scale:
                    set_tensor(model, f"{mod}.scales", tile_scales(t) if model.get_submodule(mod).tiled else t)
                elif leaf == fmt.global_scale:
                    g = t.to(torch.float32).reshape(1)
                    set_tensor(model, f"{mod}.global_scale", 1.0 / g if fmt.reciprocal else g)
                else:  # bias
                    set_tensor(model, f"{mod}.bias", t.to(torch.float32))
    if p.tie_output:
        tie_output_embedding(model)
    check_materialized(model)
    if fuse:
        fuse_projections(model)
    if os.path.exists(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()
