"""merge_attention_states: combine attention results computed over disjoint key sets."""
from typing import Sequence, Tuple, Union

import torch

from ..._validate import check_same_device, check_tensor
from .kernel import combine

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("llmkernels::merge_attention_states", mutates_args=())
def _merge_op(outs: torch.Tensor, lses: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    S, D = outs.shape[0], outs.shape[-1]
    lead = outs.shape[1:-1]
    o3 = outs.reshape(S, -1, D).transpose(0, 1)  # (row, split, d) view, no copy
    l2 = lses.reshape(S, -1).transpose(0, 1)
    out = torch.empty(lead + (D,), dtype=outs.dtype, device=outs.device)
    lse = torch.empty(lead, dtype=torch.float32, device=outs.device)
    combine(o3, l2, out.view(-1, D), lse.view(-1))
    return out, lse


@_merge_op.register_fake
def _(outs, lses):
    return outs.new_empty(outs.shape[1:]), lses.new_empty(lses.shape[1:], dtype=torch.float32)


def merge_attention_states(
    outs: Union[torch.Tensor, Sequence[torch.Tensor]], lses: Union[torch.Tensor, Sequence[torch.Tensor]]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attention outputs computed over disjoint key sets (e.g. KV-cache shards on several GPUs).

    Args:
        outs: S partial outputs, each [..., D] (a sequence, or one tensor [S, ..., D]), fp16/bf16/fp32,
            each normalised over its own keys (as every op of this library returns).
        lses: the matching log-sum-exp of the logits (natural log), each [...] (or [S, ...]); -inf marks
            a part that saw no key.
    Returns:
        (out [..., D] in the dtype of outs, lse [...] fp32): exactly what one pass over the union of the
        keys gives. Rows where every part is -inf get out 0 and lse -inf.
    """
    if not isinstance(outs, torch.Tensor):
        outs = list(outs)
        if not outs:
            raise ValueError("outs must hold at least one partial result")
        for i, o in enumerate(outs):
            check_tensor(f"outs[{i}]", o, dtypes=_OUT_DTYPES)
        outs = torch.stack(outs)
    if not isinstance(lses, torch.Tensor):
        lses = list(lses)
        for i, l in enumerate(lses):
            check_tensor(f"lses[{i}]", l)
        lses = torch.stack(lses) if lses else None
    check_tensor("outs", outs, dtypes=_OUT_DTYPES)
    check_tensor("lses", lses, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    if outs.dim() < 2 or outs.shape[0] == 0:
        raise ValueError(f"outs must be [S, ..., D] with S >= 1, got shape {tuple(outs.shape)}")
    if tuple(lses.shape) != tuple(outs.shape[:-1]):
        raise ValueError(f"lses must have shape {tuple(outs.shape[:-1])} (outs without its last dim), got {tuple(lses.shape)}")
    check_same_device(outs=outs, lses=lses)
    return _merge_op(outs.contiguous(), lses.float().contiguous())
