"""kvpress's head-wise presses decoding on llmkernels.masked_decode: the tokens a press drops are never read.

kvpress (NVIDIA's KV-cache compression library) lets head-wise presses (AdaKVPress, CriticalAdaKVPress,
DuoAttentionPress, DMSPress, KVzipPress, ...) choose different tokens per KV head; transformers' cache cannot drop
tokens per head, so kvpress keeps them all and, at each decode step, overwrites the dropped keys with a fake key
whose attention weight underflows to zero: a compressed model decodes no faster. Here the press's
`module.masked_key_indices` become a per-(batch, KV head, token) drop mask on the device (rebuilt when the press
changes them, grown with the cache), and every one-token decode step runs masked_decode, which never reads the
dropped rows (its time does not yet fall in proportion for tokens dropped one by one: docs/kvpress.md). Prefill and
every other attention call run transformers' SDPA, as under kvpress.

    from llmkernels.kvpress import GrowingCache, masked_decode_attention
    import kvpress
    press = kvpress.AdaKVPress(kvpress.KnormPress(compression_ratio=0.5))
    with press(model), masked_decode_attention(model):
        out = model.generate(ids, max_new_tokens=64, past_key_values=GrowingCache(config=model.config))

GrowingCache is transformers' DynamicCache with headroom: a decode step writes its token in place instead of
concatenating the whole cache (DynamicCache copies every layer's keys and values each step, which at long contexts
costs more than the attention itself); optional, any cache works.

Needs kvpress (extra `[kvpress]`: kvpress 0.5.5 installs transformers < 5.3; this module works with the transformers
it brings). Decode steps it cannot take (several new tokens at once, a head dim other than 64 / 128 / 256, fp32, a
CPU without the Triton interpreter) fall back to kvpress's own fake-key path.
"""
import contextlib
from typing import Iterator

import torch

try:
    import kvpress  # noqa: F401  (kvpress wraps transformers' attention functions on import)
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"llmkernels.kvpress needs kvpress ({e}): from a clone of llmkernels, "
                      "pip install -e \".[kvpress]\"") from e

from ._runtime import interpreting
from .ops.masked_decode.op import masked_decode

NAME = "llmkernels_kvpress"  # the attention implementation masked_decode_attention switches the model to
_DIMS = (64, 128, 256)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # transformers builds the masks it builds for SDPA


@contextlib.contextmanager
def masked_decode_attention(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within the block, the model's attention is this module's (SDPA for prefill, masked_decode with the press's
    drop mask for each decode step); its own implementation is restored on exit. Use inside or outside the press's
    own context manager. ValueError for a model without a transformers config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise ValueError(f"masked_decode_attention takes a transformers model, got {type(model).__name__}")
    _register()
    configs = _configs(model)
    prev = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = NAME
    try:
        yield model
    finally:
        for c, p in zip(configs, prev):
            c._attn_implementation = p


def _configs(model):
    """The model's config and its sub-configs that name an attention implementation (text configs of multimodal
    models)."""
    seen = []
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation") and all(c is not s for s in seen):
            seen.append(c)
    return seen


def drop_mask(module: torch.nn.Module, key: torch.Tensor):
    """[B, Hkv, L] bool, True where the press dropped the token (module.masked_key_indices, kvpress's (batch, head,
    position) index tensors), or None without indices. Kept on the module and rebuilt only when the press assigns new
    indices; the cache's new tokens are kept."""
    idx = getattr(module, "masked_key_indices", None)
    if idx is None:
        return None
    B, H, L = key.shape[:3]
    state = getattr(module, "_llmk_drop", None)
    if state is None or state[0] is not idx or state[1].shape[:2] != (B, H):
        b, h, s = (t.to(key.device) for t in idx)
        if len(b) and (int(b.max()) >= B or int(h.max()) >= H or int(s.max()) >= L):
            raise ValueError(f"masked_key_indices point outside the cache [B={B}, Hkv={H}, L={L}]")
        buf = torch.zeros(B, H, L + 64, dtype=torch.bool, device=key.device)
        buf[b, h, s] = True
        state = module._llmk_drop = (idx, buf)
    elif state[1].shape[2] < L:  # the same indices, a longer cache: a larger buffer, the new tokens kept
        buf = torch.zeros(B, H, 2 * L, dtype=torch.bool, device=key.device)
        buf[:, :, :state[1].shape[2]] = state[1]
        state = module._llmk_drop = (idx, buf)
    return state[1][:, :, :L]


def _sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The attention function of masked_decode_attention (transformers' AttentionInterface signature)."""
    if query.shape[2] == key.shape[2]:  # prefill: the press sets new indices after it (kvpress resets them here)
        module.masked_key_indices = None
        return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if module.training and dropout > 0:
        raise ValueError("masked_decode_attention decodes without attention dropout (model.eval())")
    if query.shape[2] != 1 or query.shape[-1] not in _DIMS or query.dtype not in (torch.float16, torch.bfloat16) \
            or not (query.is_cuda or interpreting()):
        from kvpress.attention_patch import attention_patch  # kvpress's own fake-key path
        return attention_patch(_sdpa())(module, query, key, value, attention_mask, dropout, scaling=scaling, **kwargs)
    drop = drop_mask(module, key)
    if attention_mask is not None:  # padding: transformers' mask row of the new token (SDPA: True = attend)
        m = attention_mask[:, :, -1, :key.shape[2]]
        ok = m if m.dtype == torch.bool else m == 0
        pad = ~ok.expand(key.shape[0], key.shape[1], key.shape[2])
        drop = pad if drop is None else drop | pad
    out, _ = masked_decode(query, key, value, drop_mask=drop, sm_scale=scaling)
    return out.transpose(1, 2), None


class _GrowingLayer(DynamicLayer):
    """transformers' DynamicLayer whose keys / values are views of buffers with headroom: an update writes the new
    tokens in place (a new buffer, 1/8 larger, only when full or when something replaced the tensors: a press that
    prunes, crop, beam reordering)."""

    def update(self, key_states, value_states, *args, **kwargs):
        L = self.keys.shape[-2] if self.is_initialized else 0
        n = key_states.shape[-2]
        kb, vb = getattr(self, "_kbuf", None), getattr(self, "_vbuf", None)
        fits = (kb is not None and L + n <= kb.shape[-2] and self.keys.data_ptr() == kb.data_ptr()
                and self.values.data_ptr() == vb.data_ptr() and kb.shape[:2] == key_states.shape[:2]
                and self.keys.stride() == kb.stride() and self.values.stride() == vb.stride())
        if not fits:
            cap = L + n + max(256, (L + n) // 8)
            kb = key_states.new_empty(*key_states.shape[:2], cap, key_states.shape[-1])
            vb = value_states.new_empty(*value_states.shape[:2], cap, value_states.shape[-1])
            if L:
                kb[..., :L, :] = self.keys
                vb[..., :L, :] = self.values
            if not self.is_initialized:
                self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            self._kbuf, self._vbuf = kb, vb
        kb[..., L:L + n, :] = key_states
        vb[..., L:L + n, :] = value_states
        self.keys, self.values = kb[..., :L + n, :], vb[..., :L + n, :]
        return self.keys, self.values


class GrowingCache(DynamicCache):
    """transformers' DynamicCache (same arguments) whose full-attention layers keep headroom, so a decode step writes
    in place (see _GrowingLayer); sliding-window layers stay transformers' own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self, "layer_class_to_replicate", None) is DynamicLayer:
            self.layer_class_to_replicate = _GrowingLayer
        for i, layer in enumerate(self.layers):
            if type(layer) is DynamicLayer and not layer.is_initialized:
                self.layers[i] = _GrowingLayer()
