"""Group the q / k / v and gate / up NVFP4Linear layers of known decoder layers: one kernel call each at decode,
the MLP's SiLU in the gate / up call's epilogue."""
import types

import torch

from ..ops.nvfp4.fused import group_linears, ungroup_linears
from ..ops.nvfp4.op import NVFP4Linear

# modules whose forward calls these projections on one tensor, in this order, changing nothing in place between
# (transformers' Llama, Mistral, Qwen2 and Qwen3 attention and MLP; the MoE models' attention and dense MLPs; the
# experts of hf.moe are not grouped: their layer runs all of them in one grouped kernel)
_GROUPED = {fam + kind: names for fam in ("Llama", "Mistral", "Qwen2", "Qwen3", "Qwen2Moe", "Qwen3Moe", "Mixtral")
            for kind, names in (("Attention", ("q_proj", "k_proj", "v_proj")), ("MLP", ("gate_proj", "up_proj")))}


def _silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _swiglu_forward(self, x):
    """A known MLP's forward, down(act(gate(x)) * up(x)), with act the SiLU: gate, up and the SiLU in one call."""
    return self.down_proj(self.gate_proj.group.silu_mul(x))


def fuse_projections(model: torch.nn.Module) -> int:
    """Group (llmkernels.ops.nvfp4.fused.group_linears) each known attention's q / k / v and MLP's gate / up
    NVFP4Linear layers where they can be (tiled, one input size, bias in all or none); an MLP whose act_fn is the
    SiLU (and gate, up of one size) then runs gate, up and the SiLU in one call (NVFP4Group.silu_mul; its forward
    replaced on the instance). Weights, names and state_dict do not change. Returns the number of groups made."""
    n = 0
    for mod in model.modules():
        names = _GROUPED.get(type(mod).__name__)
        parts = [getattr(mod, a, None) for a in names] if names else []
        if parts and all(isinstance(m, NVFP4Linear) and m.tiled and m.group is None for m in parts) and \
                len({(m.in_features, m.bias is None, m.packed.device) for m in parts}) == 1:
            group_linears(*parts)
            n += 1
            if names[0] == "gate_proj" and _silu(getattr(mod, "act_fn", None)) and \
                    parts[0].out_features == parts[1].out_features:
                mod.forward = types.MethodType(_swiglu_forward, mod)
    return n


def unfuse_projections(model: torch.nn.Module) -> None:
    for mod in model.modules():
        if getattr(mod.__dict__.get("forward"), "__func__", None) is _swiglu_forward:
            del mod.forward
    ungroup_linears(*(m for m in model.modules() if isinstance(m, NVFP4Linear)))
