"""moe_topk: softmax over a router's logits, the top k experts, their weights renormalised (Qwen3-MoE, Mixtral):
one launch where torch takes a softmax, a top-k and a sort (~10 us a layer at decode on the H200)."""
from typing import Tuple

import torch

from ..._launch import PlanCache, current_device, direct_ok, launch, tkey, tracing
from ..._runtime import next_pow2
from ..._validate import check_bool, check_int, check_same_device, check_tensor
from .kernel import _moe_topk_kernel

MAX_EXPERTS = 1024  # one row in one program's registers
MAX_K = 32


def _run(logits: torch.Tensor, k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    w = torch.empty(T, k, dtype=torch.float32, device=logits.device)
    i = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    if T:
        launch(_moe_topk_kernel, (T,), logits, w, i, E, logits.stride(0), logits.stride(1), K=k,
               K_PAD=next_pow2(k), BLOCK_E=max(16, next_pow2(E)), RENORM=renormalize, num_warps=4 if E > 256 else 1)
    return w, i


@torch.library.custom_op("llmkernels::moe_topk", mutates_args=())
def _moe_topk_op(logits: torch.Tensor, k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(logits, k, renormalize)


@_moe_topk_op.register_fake
def _(logits, k, renormalize):
    T = logits.shape[0]
    return logits.new_empty(T, k, dtype=torch.float32), logits.new_empty(T, k, dtype=torch.int64)


_CHECKED = PlanCache()


def moe_topk(logits: torch.Tensor, k: int, renormalize: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp16 / bf16 / fp32 (any strides), 1 <= k <= min(E, 32), E <= 1024 -> (weights fp32 [T, k],
    indices int64 [T, k]): softmax over the E experts in fp32, the k most probable in descending order (equal ones
    lowest index first), weights divided by their sum when renormalize. A row holding a NaN (or +inf) logit gets NaN
    weights (on experts 0 .. k-1). Errors name the argument."""
    key = None
    if not tracing():
        key = (tkey(logits), k, type(k), renormalize, type(renormalize), current_device())
        if _CHECKED.get(key) is not None and direct_ok(logits):
            return _run(logits, k, renormalize)
    check_tensor("logits", logits, dtypes=(torch.float16, torch.bfloat16, torch.float32), ndim=2)
    E = logits.shape[1]
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1 to {MAX_EXPERTS} experts (its last dim), got {E}")
    check_int("k", k, lo=1, hi=min(E, MAX_K))
    check_bool("renormalize", renormalize)
    check_same_device(logits=logits)
    if key is not None and direct_ok(logits):
        _CHECKED.put(key, True)
        return _run(logits, k, renormalize)
    return _moe_topk_op(logits, k, renormalize)
