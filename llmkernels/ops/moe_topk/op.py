"""moe_topk: a router's choice of experts after its linear, one launch: softmax, top k, renormalised (Qwen2/3-MoE,
Mixtral; torch: a softmax, a top-k and a sort, ~10 us a layer at decode on the H200), or DeepSeek-V3's sigmoid
scores with a selection bias and group-limited choice (DeepSeek-V3 / V3.2, GLM-4-MoE, GLM-5; torch: ~15 kernels)."""
from typing import Optional, Tuple

import torch

from ..._launch import current_device, keep_plan, kept_plan, launch, skey, tkey, tracing
from ..._runtime import next_pow2
from ..._validate import check_bool, check_choice, check_int, check_same_device, check_scale, check_tensor
from .kernel import _moe_topk_grouped_kernel, _moe_topk_kernel

MAX_EXPERTS = 1024  # one row in one program's registers
MAX_K = 32


def _run(logits: torch.Tensor, k: int, renormalize: bool, scoring: str = "softmax",
         bias: Optional[torch.Tensor] = None, n_group: int = 1, topk_group: int = 1,
         scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    w = torch.empty(T, k, dtype=torch.float32, device=logits.device)
    i = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    if not T:
        return w, i
    if scoring == "softmax":
        launch(_moe_topk_kernel, (T,), logits, w, i, E, logits.stride(0), logits.stride(1), scale, K=k,
               K_PAD=next_pow2(k), BLOCK_E=max(16, next_pow2(E)), RENORM=renormalize, num_warps=4 if E > 256 else 1)
    else:
        GS = E // n_group
        launch(_moe_topk_grouped_kernel, (T,), logits, bias.contiguous() if bias is not None else logits, w, i, GS,
               logits.stride(0), logits.stride(1), scale, NG=n_group, NG_PAD=max(2, next_pow2(n_group)),
               GS_PAD=max(2, next_pow2(GS)), TOPK_GROUP=topk_group, K=k, K_PAD=next_pow2(k), RENORM=renormalize,
               HAS_BIAS=bias is not None, num_warps=4 if E > 256 else 1)
    return w, i


@torch.library.custom_op("llmkernels::moe_topk", mutates_args=())
def _moe_topk_op(logits: torch.Tensor, k: int, renormalize: bool, scoring: str, bias: Optional[torch.Tensor],
                 n_group: int, topk_group: int, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(logits, k, renormalize, scoring, bias, n_group, topk_group, scale)


@_moe_topk_op.register_fake
def _(logits, k, renormalize, scoring, bias, n_group, topk_group, scale):
    T = logits.shape[0]
    return logits.new_empty(T, k, dtype=torch.float32), logits.new_empty(T, k, dtype=torch.int64)


def _setup(ctx, inputs, output):
    logits, _, renormalize, scoring, _, _, _, scale = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.renormalize, ctx.sigmoid, ctx.scale = renormalize, scoring == "sigmoid", scale


def _backward(ctx, g_w, _g_i):
    """d logits from d weights (the choice itself is a constant): through the renormalisation, the gather and the
    softmax / sigmoid, as transformers' routers differentiate (the bias only ranks: no gradient)."""
    logits, idx = ctx.saved_tensors
    x = logits.float()
    s = torch.sigmoid(x) if ctx.sigmoid else torch.softmax(x, dim=-1)
    g = g_w.float() * ctx.scale
    if ctx.renormalize:
        v = s.gather(1, idx)
        tot = v.sum(dim=-1, keepdim=True) + (1e-20 if ctx.sigmoid else 0.0)
        g = (g - (g * v).sum(dim=-1, keepdim=True) / tot) / tot
    ds = torch.zeros_like(x).scatter_add_(1, idx, g)
    dx = ds * s * (1 - s) if ctx.sigmoid else s * (ds - (ds * s).sum(dim=-1, keepdim=True))
    return dx.to(logits.dtype), None, None, None, None, None, None, None


_moe_topk_op.register_autograd(_backward, setup_context=_setup)
_SITE = "moe_topk"  # a checked call's key -> True


def check_routing(E: int, k, n_group=1, topk_group=1) -> None:
    """moe_topk's limits on a router of E experts choosing k (from topk_group of n_group groups): ValueError /
    TypeError naming the argument. hf.moe fuses only the routers that pass."""
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1 to {MAX_EXPERTS} experts (its last dim), got {E}")
    check_int("n_group", n_group, lo=1)
    check_int("topk_group", topk_group, lo=1, hi=n_group)
    if E % n_group:
        raise ValueError(f"n_group must divide the {E} experts, got {n_group}")
    if n_group > 1 and E // n_group < 2:
        raise ValueError(f"a group must hold at least 2 experts (its top-2 sum ranks it), got {E // n_group}")
    check_int("k", k, lo=1, hi=min(topk_group * (E // n_group), MAX_K))


def moe_topk(logits: torch.Tensor, k: int, renormalize: bool = True, *, scoring: str = "softmax",
             bias: Optional[torch.Tensor] = None, n_group: int = 1, topk_group: int = 1,
             scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """A router's choice of k experts from its logits [T, E] (fp16 / bf16 / fp32, any strides; E <= 1024, k <= 32)
    -> (weights fp32 [T, k], indices int64 [T, k]), in fp32, weights x scale.

    scoring="softmax" (Qwen2/3-MoE, Mixtral): softmax over the E experts, the k most probable in descending order,
    weights divided by their sum when renormalize. scoring="sigmoid" (DeepSeek-V3 / V3.2, GLM-4-MoE, GLM-5): scores
    sigmoid(logits); the choice ranks scores + bias (fp32 [E], optional) among the topk_group of n_group equal groups
    whose two best sum highest; weights are the chosen scores, / (sum + 1e-20) when renormalize. Equal values go
    lowest index first. A row holding a NaN logit gets NaN weights (on experts 0 .. k-1). Differentiable in logits
    (the weights' gradient, as transformers' routers have it; the choice is a constant). Errors name the argument."""
    key = None if tracing() else (_SITE, current_device(), tkey(logits), skey(k), skey(renormalize), skey(scoring),
                                  tkey(bias), skey(n_group), skey(topk_group), skey(scale))
    if kept_plan(key, (logits, bias)):
        return _run(logits, k, renormalize, scoring, bias, n_group, topk_group, scale)
    check_tensor("logits", logits, dtypes=(torch.float16, torch.bfloat16, torch.float32), ndim=2)
    check_bool("renormalize", renormalize)
    check_choice("scoring", scoring, ("softmax", "sigmoid"))
    scale = check_scale("scale", scale)
    check_routing(logits.shape[1], k, n_group, topk_group)
    if scoring == "softmax" and (bias is not None or n_group != 1 or topk_group != 1):
        raise ValueError("bias, n_group and topk_group go with scoring='sigmoid' (DeepSeek-V3's routing)")
    E = logits.shape[1]
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float16, torch.bfloat16, torch.float32), ndim=1)
        if bias.shape[0] != E:
            raise ValueError(f"bias must have one value per expert ({E}), got shape {tuple(bias.shape)}")
    check_same_device(logits=logits, bias=bias)
    if keep_plan(key, lambda: True, (logits, bias)):
        return _run(logits, k, renormalize, scoring, bias, n_group, topk_group, scale)
    return _moe_topk_op(logits, k, renormalize, scoring, bias, n_group, topk_group, scale)
