"""merge_attention_states: combine attention results computed over disjoint key sets."""
from typing import Sequence, Tuple, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, tkey, tracing
from ..._validate import check_same_device, check_tensor
from .kernel import CombinePlan, Merge2Plan

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _plan(outs: torch.Tensor) -> CombinePlan:
    """outs [S, ..., D] contiguous, lses [S, ...] contiguous: rows (...) x parts S, read in place."""
    S, D = outs.shape[0], outs.shape[-1]
    R = outs[0].numel() // D if D else 0
    return CombinePlan(R, S, D, (R * D, D, R, 1, D), True, outs.device)


def _run(plan: CombinePlan, outs: torch.Tensor, lses: torch.Tensor):
    lead = outs.shape[1:-1]
    out = torch.empty(outs.shape[1:], dtype=outs.dtype, device=outs.device)
    lse = torch.empty(lead, dtype=torch.float32, device=outs.device)
    plan(outs, lses, out, lse)
    return out, lse


@torch.library.custom_op("llmkernels::merge_attention_states", mutates_args=())
def _merge_op(outs: torch.Tensor, lses: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(_plan(outs), outs, lses)


@_merge_op.register_fake
def _(outs, lses):
    return outs.new_empty(outs.shape[1:]), lses.new_empty(lses.shape[1:], dtype=torch.float32)


def _key(parts):
    if isinstance(parts, (list, tuple)):
        return tuple(tkey(t) for t in parts)
    return tkey(parts)


def _stack(parts) -> torch.Tensor:
    return parts.contiguous() if isinstance(parts, torch.Tensor) else torch.stack(parts)


_SITE = "merge_attention_states"  # a checked call's key -> its plan


def _stacked(name: str, parts, dtypes) -> torch.Tensor:
    """One tensor [S, ...] from a tensor or a sequence of S same-shape tensors on one device."""
    if isinstance(parts, torch.Tensor):
        check_tensor(name, parts, dtypes=dtypes)
        return parts
    if not isinstance(parts, (list, tuple)):
        raise TypeError(f"{name} must be a tensor [S, ...] or a list / tuple of S tensors, got {type(parts).__name__}")
    if not parts:
        raise ValueError(f"{name} must hold at least one partial result")
    for i, t in enumerate(parts):
        check_tensor(f"{name}[{i}]", t, dtypes=dtypes)
        if t.shape != parts[0].shape:
            raise ValueError(f"{name}[{i}] has shape {tuple(t.shape)} but {name}[0] has {tuple(parts[0].shape)}")
        if t.dtype != parts[0].dtype:
            raise TypeError(f"{name}[{i}] is {t.dtype} but {name}[0] is {parts[0].dtype}")
    check_same_device(kernel=False, **{f"{name}[{i}]": t for i, t in enumerate(parts)})
    return torch.stack(parts)


def merge_attention_states(
    outs: Union[torch.Tensor, Sequence[torch.Tensor]], lses: Union[torch.Tensor, Sequence[torch.Tensor]]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attention outputs computed over disjoint key sets (e.g. KV-cache shards on several GPUs).

    Args:
        outs: S partial outputs, each [..., D] (a sequence, or one tensor [S, ..., D]), fp16/bf16/fp32,
            each normalised over its own keys (as every op of this library returns).
        lses: the matching log-sum-exp of the logits (natural log), each [...] (or [S, ...]); -inf marks
            a part that saw no key, and so does +inf (how sparse_mla marks a row with no valid index).
    Returns:
        (out [..., D] in the dtype of outs, lse [...] fp32): exactly what one pass over the union of the
        keys gives. Rows where every part saw no key get out 0 and lse -inf; a NaN lse makes its row NaN.
    """
    key = None if tracing() else (_SITE, current_device(), _key(outs), _key(lses))
    plan = kept_plan(key, (*_tensors(outs), *_tensors(lses)))
    if plan is not None:
        if type(plan) is Merge2Plan:
            return _run2(plan, outs, lses)
        return _run(plan, _stack(outs), _stack(lses))
    raw = (outs, lses)
    outs = _stacked("outs", outs, _OUT_DTYPES)
    lses = _stacked("lses", lses, (torch.float32, torch.float16, torch.bfloat16))
    if outs.dim() < 2 or outs.shape[0] == 0 or outs.shape[-1] == 0:
        raise ValueError(f"outs must be [S, ..., D] with S >= 1 and D >= 1, got shape {tuple(outs.shape)}")
    if tuple(lses.shape) != tuple(outs.shape[:-1]):
        raise ValueError(f"lses must have shape {tuple(outs.shape[:-1])} (outs without its last dim), got "
                         f"{tuple(lses.shape)}")
    check_same_device(outs=outs, lses=lses)
    outs, lses = outs.contiguous(), lses.contiguous()  # the kernel reads lse in any float dtype, +inf as -inf
    two = _two_contiguous(*raw)  # two separate parts: read in place, no stack (the checks above stacked them)
    plan = keep_plan(key, lambda: Merge2Plan(outs[0].numel() // outs.shape[-1], outs.shape[-1]) if two else
                      _plan(outs), (*_tensors(raw[0]), *_tensors(raw[1])))
    if plan is not None:
        return _run2(plan, *raw) if two else _run(plan, outs, lses)
    return _merge_op(outs, lses)


def _two_contiguous(outs, lses) -> bool:
    return isinstance(outs, (list, tuple)) and isinstance(lses, (list, tuple)) and len(outs) == 2 and \
        all(t.is_contiguous() for t in (*outs, *lses))


def _run2(plan: Merge2Plan, outs, lses):
    oa, ob = outs
    out = torch.empty(oa.shape, dtype=oa.dtype, device=oa.device)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=oa.device)
    plan(oa, ob, lses[0], lses[1], out, lse)
    return out, lse


def _tensors(parts):
    return parts if isinstance(parts, (list, tuple)) else (parts,)
