"""Inkling (transformers' InklingForCausalLM) attention on llmkernels: decode steps through inkling_decode (the
compact relative bias and the sliding window read in the kernel: older keys never read), prefill through
FlexAttention with a score_mod that reads the compact bias [B, H, S, rel_extent] (never a [q, kv] bias).

The attention's inputs are computed as transformers computes them (projections, short convolutions with their
cache states, q / k RMS norms, the log-position temperature tau on q and the bias) and its cache is transformers'
own (DynamicCache for generate; StaticDecoder's StaticCache, whose sliding layers it allocates full-length).
"""
import copy
import inspect
import warnings

import torch

from .._runtime import capturing
from ..ops.inkling_decode import inkling_decode
from ..ops.xl_paged_decode.op import _HEAD_DIMS

KNOWN = ("InklingAttention",)


def patch_module(name: str, mod) -> None:
    """Route one InklingAttention's forward through llmkernels (ValueError where its dims do not fit)."""
    if mod.head_dim not in _HEAD_DIMS:
        raise ValueError(f"{name}: head_dim={mod.head_dim}; inkling_decode takes head dims {_HEAD_DIMS}")
    params = inspect.signature(mod.k_sconv.forward).parameters
    mod.llmk_cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.2x


def patched(model) -> bool:
    """Whether patch_attention routed some InklingAttention of `model`."""
    return any(getattr(m.__dict__.get("forward"), "__func__", None) is forward for m in model.modules())


def static_cache_config(model):
    """The config StaticDecoder builds its StaticCache from: for a model with patched Inkling attention, a copy whose
    sliding layers are full-length ("hybrid"): transformers' static sliding layer rolls its buffer on a host-side
    count (a CUDA graph would replay one branch), while inkling_decode reads only the window of a full-length
    layer. Other models: their own config."""
    cfg = model.config
    if not patched(model):
        return cfg
    cfg = copy.copy(cfg)
    cfg.layer_types = ["hybrid" if t == "hybrid_sliding" else t for t in cfg.layer_types]
    return cfg


def _tau(self, positions: torch.Tensor):
    """Transformers' log-position temperature of a full layer at these query positions (fp32), or None."""
    cfg = self.config
    if self.is_sliding or cfg.log_scaling_n_floor is None:
        return None
    n = (positions + 1).float()
    return 1.0 + cfg.log_scaling_alpha * torch.log((n / cfg.log_scaling_n_floor).clamp(min=1.0))


_MASK_MEMO = {}  # id of the last decode mask -> (the mask, its starts): the layers of a step share one mask


def _starts(mask: torch.Tensor) -> torch.Tensor:
    """First visible key [B] int32 of a decode step's 4-d mask [B, 1, 1, T] (bool, or additive 0 / -inf); keys from
    there on must all be visible (left padding): ValueError otherwise (checked outside graph capture and compile)."""
    memo = _MASK_MEMO.get(id(mask))
    if memo is not None and memo[0] is mask:
        return memo[1]
    vis = mask[:, 0, -1] if mask.dtype == torch.bool else mask[:, 0, -1] == 0
    starts = vis.int().argmax(-1).int()
    if not capturing(vis.device) and not torch.compiler.is_compiling():
        T = vis.shape[-1]
        if not bool((vis.sum(-1) == T - starts).all()):
            raise ValueError("patched Inkling attention: the attention mask hides keys after a visible one; only "
                             "left padding (a hidden prefix per sequence) is supported")
    _MASK_MEMO.clear()
    _MASK_MEMO[id(mask)] = (mask, starts)
    return starts


def _flex():
    from torch.nn.attention.flex_attention import flex_attention
    if not torch.cuda.is_available():
        return flex_attention
    if not hasattr(_flex, "fn"):  # compiled once per process (eager flex materialises the scores)
        _flex.fn = torch.compile(flex_attention)
    return _flex.fn


def _prefill(self, q, k, v, rel, attention_mask, q_offset: int, kv_offset: int):
    """FlexAttention over [B, Hkv, T, D] keys: score = scale q.k + rel[b, h, i, d] at distance d = q_pos - kv_pos in
    [0, E); visible keys from transformers' 4-d mask where it built one, else causal (and the window) by position."""
    from torch.nn.attention.flex_attention import create_block_mask
    B, H, S, _ = q.shape
    T, E = k.shape[2], rel.shape[-1]
    rel = rel.transpose(1, 2).contiguous()  # [B, H, S, E]
    shift = q_offset - kv_offset

    def score_mod(score, b, h, i, j):
        d = i + shift - j
        return score + torch.where((d >= 0) & (d < E), rel[b, h, i, d.clamp(0, E - 1)].float(), 0.0)

    if isinstance(attention_mask, torch.Tensor):
        vis = attention_mask[:, 0] if attention_mask.dtype == torch.bool else attention_mask[:, 0] == 0
        vis = vis.expand(B, -1, -1)

        def mask_mod(b, h, i, j):
            return vis[b, i, j]
        mb = B
    else:
        window = self.sliding_window

        def mask_mod(b, h, i, j):
            d = i + shift - j
            return (d >= 0) & (d < window) if window is not None else d >= 0
        mb = None
    cuda = q.is_cuda
    block_mask = create_block_mask(mask_mod, mb, None, S, T, device=q.device, _compile=cuda)  # CUDA: in tiles
    with warnings.catch_warnings():  # the CPU runs flex unfused (tests, tiny models): its warning is expected
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        # the main flex kernel for short prompts too: its decoding kernel (taken below 128 queries) found no valid
        # configuration for a bf16, head-dim-64 tiny model on the H200 (inductor's NoValidChoicesError)
        out = _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=self.scaling,
                      enable_gqa=H != k.shape[1], kernel_options={"FORCE_USE_FLEX_ATTENTION": True})
    return out.transpose(1, 2)


def forward(self, hidden_states, attention_mask=None, conv_mask=None, cache=None, past_key_values=None, **kwargs):
    """InklingAttention.forward through llmkernels (see the module's doc)."""
    if self.training and torch.is_grad_enabled():
        raise ValueError("the patched Inkling attention is for inference (inkling_decode has no backward): "
                         "unpatch_attention(model) to train, or call model.eval()")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"patched Inkling attention: the model built a {type(attention_mask).__name__} mask; load "
                         "it with attn_implementation='sdpa' or 'eager' (their masks are tensors)")
    cache = past_key_values if cache is None else cache
    B, S, _ = hidden_states.shape
    shape = (B, S, -1, self.head_dim)
    ckw = {self.llmk_cache_kw: cache, "conv_mask": conv_mask}
    q = self.q_proj(hidden_states)
    k = self.k_sconv(self.k_proj(hidden_states), **ckw)
    v = self.v_sconv(self.v_proj(hidden_states), **ckw)
    rel_states = self.r_proj(hidden_states).view(B, S, self.num_heads, -1)
    q = self.q_norm(q.view(shape)).transpose(1, 2)
    k = self.k_norm(k.view(shape)).transpose(1, 2)
    v = v.view(shape).transpose(1, 2)
    kv_len = kwargs.get("llmk_kv_len")  # StaticDecoder's valid lengths [B] (int32, on the device)
    q_offset = kv_offset = 0
    if cache is not None:
        if kv_len is None or S > 1:
            kv_offset = cache.get_mask_sizes(S, self.layer_idx)[1]
            q_offset = cache.get_query_offset(self.layer_idx)
        k, v = cache.update(k, v, self.layer_idx)
    proj = self.rel_logits_proj.proj
    if S == 1:  # [B, 1, H, E]: a products-and-sum (inductor finds no GEMM template for d_rel-long rows, e.g. 4)
        rel = (rel_states.float()[..., None] * proj.float()).sum(-2).to(rel_states.dtype)
    else:
        rel = rel_states @ proj  # [B, S, H, E]: the compact bias, as transformers computes it
    if S == 1:
        if kv_len is not None:
            lengths = kv_len.to(torch.int32)
        else:
            lengths = torch.full((B,), k.shape[2], dtype=torch.int32, device=k.device)
        tau = _tau(self, (lengths - 1).long()) if kv_len is not None else \
            _tau(self, torch.full((1,), q_offset, device=q.device))
        if tau is not None:  # as transformers: q and the bias times tau in fp32, back to their dtype
            tau = tau.view(-1, 1, 1, 1)
            q, rel = (q.float() * tau).to(q.dtype), (rel.float() * tau).to(rel.dtype)
        starts = None
        if kv_len is None and isinstance(attention_mask, torch.Tensor):
            starts = _starts(attention_mask)
        o = inkling_decode(q[:, :, 0], k, v, rel[:, 0], lengths, window=self.sliding_window, starts=starts,
                           scale=self.scaling)
        o = o.reshape(B, 1, -1)
    else:
        tau = _tau(self, torch.arange(S, device=q.device) + q_offset)
        if tau is not None:
            q = (q.float() * tau.view(1, 1, S, 1)).to(q.dtype)
            rel = (rel.float() * tau.view(1, S, 1, 1)).to(rel.dtype)
        mask = None if kv_len is not None else attention_mask  # StaticDecoder's prefill: causal by position
        o = _prefill(self, q, k, v, rel, mask, q_offset, kv_offset).reshape(B, S, -1)
    return self.o_proj(o), None

