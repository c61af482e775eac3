"""Group the q / k / v and gate / up NVFP4Linear layers of known decoder layers: one kernel call each at decode."""
import torch

from ..ops.nvfp4_gemv.fused import group_linears, ungroup_linears
from ..ops.nvfp4_gemv.op import NVFP4Linear

# modules whose forward calls these projections on one tensor, in this order, changing nothing in place between
# (transformers' Llama, Mistral, Qwen2 and Qwen3 attention and MLP)
_GROUPED = {fam + kind: names for fam in ("Llama", "Mistral", "Qwen2", "Qwen3")
            for kind, names in (("Attention", ("q_proj", "k_proj", "v_proj")), ("MLP", ("gate_proj", "up_proj")))}


def fuse_projections(model: torch.nn.Module) -> int:
    """Group (llmkernels.ops.nvfp4_gemv.fused.group_linears) each known attention's q / k / v and MLP's gate / up
    NVFP4Linear layers where they can be (tiled, one input size, bias in all or none). Weights, names and state_dict
    do not change. Returns the number of groups made."""
    n = 0
    for mod in model.modules():
        names = _GROUPED.get(type(mod).__name__)
        parts = [getattr(mod, a, None) for a in names] if names else []
        if parts and all(isinstance(m, NVFP4Linear) and m.tiled and m.group is None for m in parts) and \
                len({(m.in_features, m.bias is None, m.packed.device) for m in parts}) == 1:
            group_linears(*parts)
            n += 1
    return n


def unfuse_projections(model: torch.nn.Module) -> None:
    ungroup_linears(*(m for m in model.modules() if isinstance(m, NVFP4Linear)))
