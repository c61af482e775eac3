"""Group the q / k / v and gate / up layers of known decoder layers: one kernel call each at decode (NVFP4Linear:
one tiled-kernel call, the MLP's SiLU in its epilogue; nn.Linear: one GEMM over their weights stacked)."""
import types

import torch
import torch.nn.functional as F

from .._launch import tracing
from ..ops.nvfp4.fused import group_linears, ungroup_linears
from ..ops.nvfp4.op import NVFP4Linear

# modules whose forward calls these projections on one tensor, in this order, changing nothing in place between
# (transformers' Llama, Mistral, Qwen2 and Qwen3 attention and MLP; the MoE models' attention and dense MLPs; the
# experts of hf.moe are not grouped: their layer runs all of them in one grouped kernel)
_GROUPED = {fam + kind: names for fam in ("Llama", "Mistral", "Qwen2", "Qwen3", "Qwen2Moe", "Qwen3Moe", "Mixtral")
            for kind, names in (("Attention", ("q_proj", "k_proj", "v_proj")), ("MLP", ("gate_proj", "up_proj")))}


def _silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


class LinearStack:
    """2-3 nn.Linear layers of one input (q / k / v, gate / up) as one GEMM: their weights (and biases) become views
    of one stacked tensor (no memory added; names, state_dict and in-place updates unchanged). As NVFP4Group: the
    first part called computes every part's output, a later part called on the same tensor (unchanged since, eager)
    takes its columns. Each layer runs alone where the stack cannot serve: grad enabled for weights that need it,
    or the parts no longer views of it (after .to(), a load with assign=True: checked on eager calls, and the stack
    then dropped; under torch.compile convert the model before fusing). An 8B-shaped step at 8 tokens on the H200:
    q / k / v took 27 us in 3 GEMMs (k and v at 37 % of their floor) where one stacked GEMM reads them in ~15."""

    def __init__(self, parts):
        m0 = parts[0]
        if not 2 <= len(parts) <= 3 or not all(type(m) is torch.nn.Linear for m in parts):
            raise TypeError("parts must be 2 or 3 nn.Linear modules")
        if not _stackable(parts):
            raise ValueError("parts must be ungrouped nn.Linear modules of one in_features, dtype and device, with "
                             "a bias in all or none")
        self.cols = [0]
        for m in parts:
            self.cols.append(self.cols[-1] + m.out_features)
        self.weight = torch.cat([m.weight.detach() for m in parts])
        self.bias = None if m0.bias is None else torch.cat([m.bias.detach() for m in parts])
        for i, m in enumerate(parts):
            sl = slice(self.cols[i], self.cols[i + 1])
            m.weight = torch.nn.Parameter(self.weight[sl], requires_grad=m.weight.requires_grad)
            if self.bias is not None:
                m.bias = torch.nn.Parameter(self.bias[sl], requires_grad=m.bias.requires_grad)
            m.group, m.group_index = self, i
            m.forward = types.MethodType(_stacked_part_forward, m)
        self.parts, self.stash = list(parts), None
        self.ptrs = self._ptrs()

    def _ptrs(self):
        return [(m.weight.data_ptr(), m.bias.data_ptr() if m.bias is not None else 0) for m in self.parts]

    def _usable(self) -> bool:
        if torch.is_grad_enabled() and any(p.requires_grad for m in self.parts for p in m.parameters()):
            return False
        if self.weight is not None and not tracing() and self._ptrs() != self.ptrs:
            self.weight = self.bias = None  # the parts were replaced: free the stack
        return self.weight is not None

    def forward(self, part, x):
        i = part.group_index
        st, ver = self.stash, 0 if tracing() else x._version
        if st is not None and st[0] is x and st[1] == ver:  # (the call that stashed it checked _usable)
            y = st[2]
        elif self._usable():
            y = F.linear(x, self.weight, self.bias)
            self.stash = (x, ver, y)
        else:
            self.stash = None
            return F.linear(x, part.weight, part.bias)
        if i == len(self.parts) - 1:
            self.stash = None
        return y[..., self.cols[i]:self.cols[i + 1]]

    def silu_mul(self, x):
        """silu(parts[0](x)) * parts[1](x) (a SwiGLU MLP's input to its down projection) from one GEMM."""
        if len(self.parts) != 2 or self.cols[1] * 2 != self.cols[2]:
            raise ValueError("silu_mul needs a stack of 2 parts with the same out_features")
        if not self._usable():
            g, u = self.parts
            return F.silu(F.linear(x, g.weight, g.bias)) * F.linear(x, u.weight, u.bias)
        y = F.linear(x, self.weight, self.bias)
        return F.silu(y[..., :self.cols[1]]) * y[..., self.cols[1]:]


def _stacked_part_forward(self, x):
    return self.group.forward(self, x)


def _swiglu_forward(self, x):
    """A known MLP's forward, down(act(gate(x)) * up(x)), with act the SiLU: gate, up and the SiLU in one call (each
    alone once the group is gone, e.g. the layers replaced by quantize_(fuse=False))."""
    g = getattr(self.gate_proj, "group", None)
    if g is None:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return self.down_proj(g.silu_mul(x))


def _stackable(parts) -> bool:
    return all(type(m) is torch.nn.Linear and "group" not in vars(m) for m in parts) and \
        len({(m.in_features, m.bias is None, m.weight.dtype, m.weight.device) for m in parts}) == 1


def fuse_projections(model: torch.nn.Module) -> int:
    """Group each known attention's q / k / v and MLP's gate / up layers where they can be: NVFP4Linear ones
    (tiled, one input size, bias in all or none) through llmkernels.ops.nvfp4.fused.group_linears, nn.Linear ones
    (one input size, dtype and device) as a LinearStack; an MLP whose act_fn is the SiLU (and gate, up of one size)
    then runs gate, up and the SiLU from one call (the group's silu_mul; its forward replaced on the instance).
    Names and state_dict do not change. Returns the number of groups made."""
    n = 0
    for mod in model.modules():
        names = _GROUPED.get(type(mod).__name__)
        parts = [getattr(mod, a, None) for a in names] if names else []
        nvfp4 = bool(parts) and all(isinstance(m, NVFP4Linear) and m.tiled and m.group is None for m in parts) and \
            len({(m.in_features, m.bias is None, m.packed.device) for m in parts}) == 1
        if nvfp4 or (parts and _stackable(parts)):
            group_linears(*parts) if nvfp4 else LinearStack(parts)
            n += 1
            if names[0] == "gate_proj" and _silu(getattr(mod, "act_fn", None)) and \
                    parts[0].out_features == parts[1].out_features:
                mod.forward = types.MethodType(_swiglu_forward, mod)
    return n


def unfuse_projections(model: torch.nn.Module) -> None:
    """Undo fuse_projections (stacked nn.Linear weights stay views of one tensor: same values, no memory added)."""
    for mod in model.modules():
        if getattr(mod.__dict__.get("forward"), "__func__", None) in (_swiglu_forward, _stacked_part_forward):
            del mod.forward
        if isinstance(vars(mod).get("group"), LinearStack):
            del mod.group, mod.group_index
    ungroup_linears(*(m for m in model.modules() if isinstance(m, NVFP4Linear)))
