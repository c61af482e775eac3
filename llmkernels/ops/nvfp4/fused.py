"""Two or three NVFP4Linear layers of one input (a fused qkv, gate / up) computed by one tiled-kernel call.

Each layer keeps its own buffers, names and state_dict; the kernel reads every part's weights, scales, global scale
and bias where they lie and writes the outputs side by side, so a decode step launches one kernel where it
launched three, on one grid sized for the stacked rows (an 8B-shaped model's 32 layers at one token, one CUDA
graph: 1.81 ms against 2.19 for the same linears unfused; notes/nvfp4_gemv.md, linear round 18).

The first part called computes every part's output and keeps it; a later part called with the same input object
(unchanged since: its version counter, eager) takes its columns; the last part drops it. Under torch.compile the
version counter is not traceable: the same tensor object is taken to hold the same values, which the attention and
MLP forwards the grouping is meant for guarantee (they modify nothing in place between the projections).

A gate / up group's silu_mul(x) is silu(gate(x)) * up(x) in one call: the kernel interleaves the two parts' row
blocks and applies the activation in its epilogue (what hf.fuse_projections has a SwiGLU MLP's forward call).
"""
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..._launch import current_device, keep_plan, kept_plan, tkey, tracing
from ..._runtime import capability
from .op import NVFP4Linear, _linear_tiled, check_tiled_call
from .tiled import MMA_MAX_T, TiledPlan, tiled_launch, tiled_usable


@torch.library.custom_op("llmkernels::nvfp4_linear_tiled_parts", mutates_args=())
def _parts_op(x: torch.Tensor, packed: List[torch.Tensor], scales: List[torch.Tensor],
              global_scale: List[torch.Tensor], bias: List[Optional[torch.Tensor]], glu: bool = False) -> torch.Tensor:
    return _parts(x, packed, scales, global_scale, bias, glu)


def _width(packed, glu: bool) -> int:
    n = sum(p.shape[0] for p in packed)
    return n // 2 if glu else n


def _parts(x, packed, scales, global_scale, bias, glu=False):
    """x [T, K] -> [T, sum of the parts' N] (glu: [T, N] = silu(part 0) * part 1): one tiled-kernel call where it
    runs, else each part's own path."""
    if tiled_usable(x):
        y = torch.empty(x.shape[0], _width(packed, glu), dtype=x.dtype, device=x.device)
        return tiled_launch(x, packed[0], scales[0], global_scale[0], bias[0], y,
                            parts=list(zip(packed[1:], scales[1:], global_scale[1:], bias[1:])), glu=glu)
    ys = [_linear_tiled(x, *w) for w in zip(packed, scales, global_scale, bias)]
    return F.silu(ys[0]) * ys[1] if glu else torch.cat(ys, dim=1)


@_parts_op.register_fake
def _(x, packed, scales, global_scale, bias, glu=False):
    return x.new_empty((x.shape[0], _width(packed, glu)))


_GROUPS = "nvfp4_group"  # a checked stacked call's key -> its TiledPlan, or False (not tiled)


class NVFP4Group:
    """Computes the NVFP4Linear layers `parts` (2-3, tiled, one in_features, one device, bias in all or none)
    together; installed as each part's `group` (see group_linears)."""

    def __init__(self, parts):
        if not 2 <= len(parts) <= 3 or not all(isinstance(m, NVFP4Linear) for m in parts):
            raise TypeError("parts must be 2 or 3 NVFP4Linear modules")
        m0 = parts[0]
        for m in parts:
            if not m.tiled or m.in_features != m0.in_features or (m.bias is None) != (m0.bias is None) or \
                    m.packed.device != m0.packed.device or m.group is not None:
                raise ValueError("parts must be ungrouped NVFP4Linear modules in the tiled layout with one "
                                 "in_features, one device, and a bias in all or none")
        self.parts = list(parts)
        cols = [0]
        for m in parts:
            cols.append(cols[-1] + m.out_features)
        self.cols = cols
        self.stash = None  # (x, its version, the stacked output) between the first part's call and the last's

    def _buffers(self):
        return [(m.packed, m.scales, m.global_scale, m.bias) for m in self.parts]

    @staticmethod
    def _usable(x) -> bool:
        """Whether the stacked call can run the tiled kernel (the op checks alignment when it runs)."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] == 0 or x.device.type != "cuda":
            return False
        return capability(x.device)[0] >= 9 and 0 < x.numel() // x.shape[-1] <= MMA_MAX_T

    def _stacked(self, x, glu=False):
        """[..., sum N] for x [..., K] (glu: [..., N], silu(part 0) * part 1): a kept plan where this call's key was
        checked before."""
        bufs = self._buffers()
        flat = [t for w in bufs for t in w]
        width = self.cols[-1] // 2 if glu else self.cols[-1]
        key = None if tracing() else (_GROUPS, current_device(), tkey(x), *map(tkey, flat), glu)
        plan = kept_plan(key, (x, *flat))  # False: checked, but the tiled kernel cannot run it
        if plan is None:
            for m in self.parts:
                x2 = check_tiled_call(m, x)
            plan = keep_plan(key, lambda: TiledPlan(x2, [m.out_features for m in self.parts], flat[3] is not None,
                                                    glu) if x.stride(-1) == 1 and tiled_usable(x2) else False,
                             (x, *flat))
        if plan:
            return plan(x.reshape(-1, x.shape[-1]), *flat).reshape(*x.shape[:-1], width)
        p, s, g, b = zip(*bufs)
        y = _parts_op(x.reshape(-1, x.shape[-1]), list(p), list(s), list(g), list(b), glu)
        return y.reshape(*x.shape[:-1], width)

    def silu_mul(self, x):
        """silu(parts[0](x)) * parts[1](x), a gated MLP's (SwiGLU) input to its down projection: where the group's
        call runs, one kernel call with the activation in its epilogue (no [.., 2 N] output, no kernel of its own);
        else each part alone and torch's silu. Two parts of one out_features."""
        if len(self.parts) != 2 or self.parts[0].out_features != self.parts[1].out_features:
            raise ValueError("silu_mul needs a group of 2 parts with the same out_features")
        if not self._usable(x):
            return F.silu(self.parts[0].forward_alone(x)) * self.parts[1].forward_alone(x)
        return self._stacked(x, glu=True)

    def forward(self, part, x):
        if not self._usable(x):
            self.stash = None
            return part.forward_alone(x)
        i = part.group_index
        st, ver = self.stash, 0 if tracing() else x._version
        if st is not None and st[0] is x and st[1] == ver:
            y = st[2]
        else:
            y = self._stacked(x)
            self.stash = (x, ver, y)
        if i == len(self.parts) - 1:
            self.stash = None
        return y[..., self.cols[i]:self.cols[i + 1]]


def group_linears(*parts) -> NVFP4Group:
    """Have the NVFP4Linear layers `parts` (2-3 of one input, e.g. q, k and v) computed by one kernel call when
    they are called on the same tensor, in order: the first computes all, the others take their columns. Decode
    sizes on Hopper (1-16 tokens) only; anything else runs each layer alone. Undo with ungroup_linears."""
    g = NVFP4Group(parts)
    for i, m in enumerate(parts):
        m.group, m.group_index = g, i
    return g


def ungroup_linears(*parts) -> None:
    for m in parts:
        m.group = None
        m.__dict__.pop("group_index", None)
