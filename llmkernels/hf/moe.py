"""Mixture-of-experts models with NVFP4 experts. transformers 5.x fuses each layer's experts into 3-D parameters
(gate_up_proj [E, 2I, H], down_proj [E, H, I]); NVFP4 checkpoints (llm-compressor, ModelOpt) keep one quantized
linear per expert and projection, under the names of the original checkpoints. `unfuse_experts` puts in place of
each fused experts module an `Experts` list of per-expert MLPs whose nn.Linear layers carry those names, so that
load_nvfp4, quantize_ and save_nvfp4 treat them as any other linear (experts stay NVFP4, never densified).

Families (config.model_type): Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 / V3.2, GLM-4-MoE and GLM-5
(experts.{e}.gate_proj / up_proj / down_proj; their shared experts are ordinary MLPs), Mixtral
(block_sparse_moe.experts.{e}.w1 / w3 / w2 in checkpoints; transformers names the block `mlp`).
"""
from typing import Dict, Tuple

import torch

from ..ops.moe_topk import moe_topk
from ..ops.moe_topk.op import check_routing
from ..ops.nvfp4.moe import nvfp4_moe
from ..ops.nvfp4.op import NVFP4Linear

# model_type -> ((gate, up, down) names per expert in checkpoints, (model path part, checkpoint path part) renames)
FAMILIES: Dict[str, Tuple[Tuple[str, str, str], Tuple[Tuple[str, str], ...]]] = {
    "qwen2_moe": (("gate_proj", "up_proj", "down_proj"), ()),
    "qwen3_moe": (("gate_proj", "up_proj", "down_proj"), ()),
    "deepseek_v3": (("gate_proj", "up_proj", "down_proj"), ()),  # shared experts and router as transformers has them
    "glm4_moe": (("gate_proj", "up_proj", "down_proj"), ()),
    "deepseek_v32": (("gate_proj", "up_proj", "down_proj"), ()),  # the DSA models (hf.dsa patches their attention)
    "glm_moe_dsa": (("gate_proj", "up_proj", "down_proj"), ()),
    "mixtral": (("w1", "w3", "w2"), ((".mlp.", ".block_sparse_moe."),)),
}


_EDITS = [0]  # submodules set on any ExpertMLP / Experts so far: Experts re-checks what it may run when it changes


class ExpertMLP(torch.nn.Module):
    """One expert: down(act(gate(x)) * up(x)), its three linears under the checkpoint's names."""

    def __setattr__(self, name, value):
        if isinstance(value, torch.nn.Module):
            _EDITS[0] += 1
        super().__setattr__(name, value)

    def __init__(self, names, hidden: int, inter: int, act, device=None, dtype=None):
        super().__init__()
        self.names, self.act_fn = names, act
        kw = dict(bias=False, device=device, dtype=dtype)
        for n, (i, o) in zip(names, ((hidden, inter), (hidden, inter), (inter, hidden))):
            setattr(self, n, torch.nn.Linear(i, o, **kw))

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act_fn(gate(x)) * up(x))


def _silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


class Experts(torch.nn.ModuleList):
    """A layer's experts as a list of ExpertMLP, called as transformers calls its fused experts module:
    (hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H], each token's sum of its experts'
    outputs times their routing weights.

    Where every expert is NVFP4 in the tiled layout with the SiLU (`grouped_capable`), every call runs
    llmkernels.nvfp4_moe: routing read on the device (CUDA-graph capturable); up to MOE_MAX_T tokens one program
    group per (token, slot), more (prefill) grouped by expert so that each expert's weights are read once per tile of
    its tokens. The experts' buffers then become views of one stack per projection (made on
    the first such call). Otherwise the experts no token chose are skipped and the others run one by one
    (`one_by_one`)."""

    def __init__(self, experts, hidden: int, inter: int):
        super().__init__(experts)
        self.num_experts, self.hidden_dim, self.intermediate_dim = len(experts), hidden, inter
        self._stacks = self._capable = None

    def __setitem__(self, idx, module):
        _EDITS[0] += 1
        super().__setitem__(idx, module)

    def grouped_capable(self) -> bool:
        """Every expert NVFP4Linear, tiled, without bias or group, and the SiLU as the activation."""
        return all(_silu(ex.act_fn) and all(
            isinstance(m, NVFP4Linear) and m.tiled and m.bias is None and m.group is None
            for m in (getattr(ex, n) for n in ex.names)) for ex in self)

    def _stacked(self):
        """(gate, up, down) stacks of (packed, scales, global scales), the experts' buffers their views; rebuilt
        when a buffer was replaced since."""
        if self._stacks is not None and torch.compiler.is_compiling():  # (made by an eager call: the prefill)
            return self._stacks
        first = [getattr(self[0], n) for n in self[0].names]
        if self._stacks is not None and all(m.packed.data_ptr() == s[0][0].data_ptr()
                                            for m, s in zip(first, self._stacks)):
            return self._stacks
        stacks = []
        with torch.no_grad():
            for n in self[0].names:
                mods = [getattr(ex, n) for ex in self]
                st = (torch.stack([m.packed for m in mods]), torch.stack([m.scales for m in mods]),
                      torch.cat([m.global_scale.reshape(1).float() for m in mods]))
                for e, m in enumerate(mods):
                    m._buffers["packed"], m._buffers["scales"] = st[0][e], st[1][e]
                    m._buffers["global_scale"] = st[2][e:e + 1]
                stacks.append(st)
        self._stacks = tuple(stacks)
        return self._stacks

    def _grouped(self) -> bool:
        """grouped_capable, re-checked only after a submodule was set (a step of a 48-layer, 128-expert model would
        otherwise spend milliseconds of host time checking)."""
        if self._capable is None or self._capable[0] != _EDITS[0]:
            self._capable = (_EDITS[0], self.grouped_capable())
        return self._capable[1]

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if hidden_states.dtype in (torch.float16, torch.bfloat16) and self._grouped():
            return nvfp4_moe(hidden_states, top_k_index, top_k_weights, *self._stacked())
        return self.one_by_one(hidden_states, top_k_index, top_k_weights)

    def one_by_one(self, hidden_states, top_k_index, top_k_weights):
        """The experts some token chose, each on its own tokens (the hit list read on the host, as transformers' own
        loop does): for experts nvfp4_moe does not take."""
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = (mask[:self.num_experts].sum(dim=(-1, -2)) > 0).nonzero().flatten().tolist()
        for e in hit:
            pos, tok = torch.where(mask[e])
            y = self[e](hidden_states[tok]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def is_fused_experts(mod) -> bool:
    """transformers' fused experts module: gate_up_proj [E, 2I, H] and down_proj [E, H, I] tensors."""
    g, d = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return isinstance(g, torch.Tensor) and isinstance(d, torch.Tensor) and g.dim() == 3 and d.dim() == 3


def family(model) -> Tuple[Tuple[str, str, str], Tuple[Tuple[str, str], ...]]:
    """The model's entry of FAMILIES; ValueError for an MoE model of another type."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    mt = getattr(cfg, "model_type", None)
    if mt not in FAMILIES:
        raise ValueError(f"NVFP4 experts of model type {mt!r} are not supported yet (supported: "
                         f"{', '.join(FAMILIES)}); its fused experts modules would stay dense")
    return FAMILIES[mt]


def has_fused_experts(model) -> bool:
    return any(is_fused_experts(m) for m in model.modules())


DEVICE_ROUTED = ("grouped_mm", "batched_mm")  # transformers' experts implementations that never sync the host


def host_routed(model, batch: int) -> bool:
    """Whether a step of `batch` tokens reads its chosen experts on the host (a CUDA graph cannot capture it):
    transformers' fused experts on its eager loop, or Experts that cannot run nvfp4_moe (dense or untiled experts)."""
    for m in model.modules():
        if is_fused_experts(m) and getattr(getattr(m, "config", None), "_experts_implementation",
                                           "eager") not in DEVICE_ROUTED:
            return True
        if isinstance(m, Experts) and not m.grouped_capable():
            return True
    return False


def unfuse_experts(model, materialize: bool) -> int:
    """Replace every fused experts module of model by an Experts list (see the module's doc); materialize: slice the
    fused weights into the per-expert linears (quantize_), else leave them on the meta device (load_nvfp4). Returns
    how many were replaced (0 for a model without fused experts)."""
    targets = [(n, m) for n, m in model.named_modules() if is_fused_experts(m)]
    if not targets:
        return 0
    names = family(model)[0]
    for name, mod in targets:
        E, I2, H = mod.gate_up_proj.shape
        inter = I2 // 2
        if tuple(mod.down_proj.shape) != (E, H, inter):
            raise ValueError(f"{name}: gate_up_proj {tuple(mod.gate_up_proj.shape)} and down_proj "
                             f"{tuple(mod.down_proj.shape)} are not [E, 2I, H] and [E, H, I]")
        dev = "meta" if not materialize else mod.gate_up_proj.device
        experts = [ExpertMLP(names, H, inter, mod.act_fn, dev, mod.gate_up_proj.dtype) for _ in range(E)]
        if materialize:
            with torch.no_grad():
                for e, ex in enumerate(experts):
                    gate, up, down = (getattr(ex, n) for n in names)
                    gate.weight.copy_(mod.gate_up_proj[e, :inter])
                    up.weight.copy_(mod.gate_up_proj[e, inter:])
                    down.weight.copy_(mod.down_proj[e])
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, Experts(experts, H, inter))
    fuse_routers(model)
    return len(targets)


def _softmax_router_forward(self, hidden_states):
    """transformers' (>= 5.17) Qwen2 / Qwen3-MoE and Mixtral router forward with moe_topk in place of its softmax,
    top-k and renormalisation: (logits, weights, indices); Qwen's weights in the logits' dtype, Mixtral's fp32."""
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    weights, indices = moe_topk(logits, self.top_k, getattr(self, "norm_topk_prob", True))
    return logits, weights.to(logits.dtype) if hasattr(self, "norm_topk_prob") else weights, indices


def _sigmoid_router_forward(self, hidden_states):
    """transformers' (>= 5.17) DeepSeek-V3 / V3.2, GLM-4-MoE and GLM-5 router forward (fp32 logits) with moe_topk in
    place of its sigmoid, group-limited choice, gather, renormalisation and scaling (about 15 kernels)."""
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim).float(), self.weight.float())
    weights, indices = moe_topk(logits, self.top_k, self.norm_topk_prob, scoring="sigmoid",
                                bias=self.e_score_correction_bias, n_group=self.num_group, topk_group=self.topk_group,
                                scale=float(self.routed_scaling_factor))
    return logits, weights, indices


# router class -> the forward that replaces it (transformers >= 5.17: these routers return (logits, weights, indices))
_ROUTERS = {"Qwen2MoeTopKRouter": _softmax_router_forward, "Qwen3MoeTopKRouter": _softmax_router_forward,
            "MixtralTopKRouter": _softmax_router_forward, "DeepseekV3TopkRouter": _sigmoid_router_forward,
            "DeepseekV32TopkRouter": _sigmoid_router_forward, "Glm4MoeTopkRouter": _sigmoid_router_forward,
            "GlmMoeDsaTopkRouter": _sigmoid_router_forward}
_FUSED: Dict[type, type] = {}
ROUTER_LOGITS_SINCE = (5, 17)  # transformers versions whose routers return (logits, weights, indices) as above


def _fusable(router) -> bool:
    """moe_topk's limits (experts, k, groups) hold for this router."""
    try:
        check_routing(router.weight.shape[0], router.top_k, getattr(router, "num_group", 1),
                      getattr(router, "topk_group", 1))
    except (TypeError, ValueError):
        return False
    return True


def fuse_routers(model) -> int:
    """Give every router of model that _ROUTERS knows the moe_topk forward (one launch for torch's softmax / sigmoid,
    group choice, top-k and sort; the same choices and weights), by switching its class to a subclass; parameters
    and state_dict stay. transformers before 5.17 returned its routers' probabilities as the logits: left as they
    are, as are routers past moe_topk's limits. Returns how many routers were switched."""
    import transformers
    if tuple(int(v) for v in transformers.__version__.split(".")[:2]) < ROUTER_LOGITS_SINCE:
        return 0
    n = 0
    for m in model.modules():
        cls = type(m)
        if cls.__name__ in _ROUTERS and cls not in _FUSED.values() and _fusable(m):
            m.__class__ = _fused_class(cls)
            n += 1
    return n


def _fused_class(cls: type) -> type:
    """The router class with moe_topk's forward, made once and kept as this module's attribute Fused<name>, so that
    pickle (torch.save of a whole model) finds it."""
    if cls not in _FUSED:
        name = "Fused" + cls.__name__
        fused = type(name, (cls,), {"forward": _ROUTERS[cls.__name__], "__module__": __name__, "__qualname__": name})
        _FUSED[cls] = globals()[name] = fused
    return _FUSED[cls]


def __getattr__(name: str):
    """Fused<router> in a process that has not fused one yet (unpickling a saved model): made from transformers'."""
    base = name[len("Fused"):] if name.startswith("Fused") else None
    if base in _ROUTERS:
        import importlib
        package = {"Qwen2Moe": "qwen2_moe", "Qwen3Moe": "qwen3_moe", "Mixtral": "mixtral", "DeepseekV3": "deepseek_v3",
                   "DeepseekV32": "deepseek_v32", "Glm4Moe": "glm4_moe", "GlmMoeDsa": "glm_moe_dsa"}[
            base.removesuffix("TopKRouter").removesuffix("TopkRouter")]
        mod = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
        return _fused_class(getattr(mod, base))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def renames(model) -> Tuple[Tuple[str, str], ...]:
    """(model path part, checkpoint path part) pairs for this model's names (none without Experts)."""
    return family(model)[1] if any(isinstance(m, Experts) for m in model.modules()) else ()


def to_checkpoint_name(name: str, pairs) -> str:
    """A model tensor or module name as the family's checkpoints spell it (pairs: renames(model))."""
    for a, b in pairs:
        name = ("." + name).replace(a, b)[1:]
    return name


def from_checkpoint_name(name: str, pairs) -> str:
    for a, b in pairs:
        name = ("." + name).replace(b, a)[1:]
    return name
