"""kvpress's head-wise presses decoding on llmkernels.masked_decode: the tokens a press drops are never read.

kvpress (NVIDIA's KV-cache compression library) lets head-wise presses (AdaKVPress, CriticalAdaKVPress,
DuoAttentionPress, DMSPress, KVzipPress, ...) choose different tokens per KV head; transformers' cache cannot drop
tokens per head, so kvpress keeps them all and, at each decode step, overwrites the dropped keys with a fake key
whose attention weight underflows to zero: a compressed model decodes no faster. Here the press's
`module.masked_key_indices` become masked_decode's kept lists on the device (each (sequence, KV head) row's kept
positions, rebuilt when the press changes them; the tokens generated since are all kept), and every one-token decode
step runs masked_decode, which reads only the listed rows, in time that follows their number (lists=False: a drop
mask instead, whose tiles are all visited). Prefill and every other attention call run transformers' SDPA, as under
kvpress. PressDecoder decodes from a press's prefill with one CUDA graph per step.

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

from ._runtime import capture_step, interpreting
from ._validate import check_bool, check_int
from .ops.masked_decode.op import kept_lists, masked_decode

NAME = "llmkernels_kvpress"  # the attention implementation masked_decode_attention switches the model to
NAME_MASK = "llmkernels_kvpress_mask"  # ... with lists=False
GRAPH_NAME = "llmkernels_kvpress_graph"  # PressDecoder's decode steps (no mask built: transformers skips it)
_DIMS = (64, 128, 256)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    for name, fn in ((NAME, _attention), (NAME_MASK, _attention_mask), (GRAPH_NAME, _graph_attention)):
        AttentionInterface.register(name, fn)
    for name in (NAME, NAME_MASK):
        AttentionMaskInterface.register(name, sdpa_mask)  # transformers builds the masks it builds for SDPA


@contextlib.contextmanager
def _attention_implementation(model: torch.nn.Module, name: str, caller: str) -> Iterator[torch.nn.Module]:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise ValueError(f"{caller} takes a transformers model, got {type(model).__name__}")
    _register()
    configs = _configs(model)
    prev = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield model
    finally:
        for c, p in zip(configs, prev):
            c._attn_implementation = p


def masked_decode_attention(model: torch.nn.Module, lists: bool = True):
    """A context manager: within it the model's attention is this module's (SDPA for prefill, masked_decode with the
    press's kept tokens for each decode step: as kept lists, or with lists=False as a drop mask); its own
    implementation is restored on exit. Use inside or outside the press's own context manager. ValueError for a
    model without a transformers config."""
    check_bool("lists", lists)
    return _attention_implementation(model, NAME if lists else NAME_MASK, "masked_decode_attention")


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
        b, h, s = _indices(idx, B, H, L, key.device)
        buf = torch.zeros(B, H, L + 64, dtype=torch.bool, device=key.device)
        buf[b, h, s] = True
        state = module._llmk_drop = (idx, buf)
    elif state[1].shape[2] < L:  # the same indices, a longer cache: a larger buffer, the new tokens kept
        buf = torch.zeros(B, H, 2 * L, dtype=torch.bool, device=key.device)
        buf[:, :, :state[1].shape[2]] = state[1]
        state = module._llmk_drop = (idx, buf)
    return state[1][:, :, :L]


def kept(module: torch.nn.Module, key: torch.Tensor, attention_mask=None):
    """masked_decode's (kept_idx, kept_len, dense_from) for this layer's cache `key` [B, Hkv, L, D]: each row's
    positions below dense_from (the cache length when they were built) that the press kept (not in
    module.masked_key_indices) and, given transformers' 4-d attention_mask, that are not padding; every later
    position kept. Kept on the module and rebuilt only when the press assigns new indices (a new prefill resets
    them); None where nothing is dropped."""
    idx = getattr(module, "masked_key_indices", None)
    B, H, L = key.shape[:3]
    state = getattr(module, "_llmk_kept", None)
    if state is not None and state[0] is idx and state[1].shape[:2] == (B, H):
        return state[1:]
    drop = _dropped(idx, _padding(attention_mask, B, H, L), B, H, L, key.device)
    if drop is None:
        return None
    module._llmk_kept = (idx, *kept_lists(drop), L)
    return module._llmk_kept[1:]


def _dropped(idx, pad, B, H, L, device):
    """[B, H, L] bool: the press's indices (kvpress's (batch, head, position) tensors) and the padding pad (or
    None) dropped; None where neither drops anything."""
    if idx is None and pad is None:
        return None
    drop = torch.zeros(B, H, L, dtype=torch.bool, device=device)
    if pad is not None:
        drop |= pad
    if idx is not None:
        b, h, s = _indices(idx, B, H, L, device)
        drop[b, h, s] = True
    return drop


def _padding(attention_mask, B, H, L):
    """[B, H, L] bool (a broadcast view), True at padding (transformers' mask row of the new token; SDPA's: True =
    attend), or None."""
    if attention_mask is None:
        return None
    m = attention_mask[:, :, -1, :L]
    ok = m if m.dtype == torch.bool else m == 0
    return (~ok).expand(B, H, L)


def _indices(idx, B, H, L, device):
    b, h, s = (t.to(device) for t in idx)
    if len(b) and (int(b.max()) >= B or int(h.max()) >= H or int(s.max()) >= L):
        raise ValueError(f"masked_key_indices point outside the cache [B={B}, Hkv={H}, L={L}]")
    return b, h, s


def _sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, lists=True, **kwargs):
    """The attention function of masked_decode_attention (transformers' AttentionInterface signature)."""
    if query.shape[2] == key.shape[2]:  # prefill: the press sets new indices after it (kvpress resets them here)
        module.masked_key_indices = None
        module.__dict__.pop("_llmk_kept", None)
        return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if module.training and dropout > 0:
        raise ValueError("masked_decode_attention decodes without attention dropout (model.eval())")
    if query.shape[2] != 1 or query.shape[-1] not in _DIMS or query.dtype not in (torch.float16, torch.bfloat16) \
            or not (query.is_cuda or interpreting()):
        from kvpress.attention_patch import attention_patch  # kvpress's own fake-key path
        return attention_patch(_sdpa())(module, query, key, value, attention_mask, dropout, scaling=scaling, **kwargs)
    if lists:
        k = kept(module, key, attention_mask)
        kw = dict(kept_idx=k[0], kept_len=k[1], dense_from=k[2]) if k is not None else {}
        out, _ = masked_decode(query, key, value, sm_scale=scaling, **kw)
        return out.transpose(1, 2), None
    drop = drop_mask(module, key)
    pad = _padding(attention_mask, *key.shape[:3])
    if pad is not None:
        drop = pad.contiguous() if drop is None else drop | pad
    out, _ = masked_decode(query, key, value, drop_mask=drop, sm_scale=scaling)
    return out.transpose(1, 2), None


def _attention_mask(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    return _attention(module, query, key, value, attention_mask, dropout, scaling, lists=False, **kwargs)


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


def compacted(keys: torch.Tensor, values: torch.Tensor, kept_idx: torch.Tensor, width: int):
    """keys, values [B, Hkv, L, D] with each row's first `width` entries of kept_idx (kept_lists' order: the kept
    positions first) moved to its front: [B, Hkv, width, D] each, which masked_decode reads as prefixes (kept_len
    without kept_idx)."""
    g = kept_idx[..., :width].long()[..., None].expand(*keys.shape[:2], width, keys.shape[-1])
    return keys.gather(2, g), values.gather(2, g)


def _graph_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """PressDecoder's decode attention: masked_decode over the first llmk_kv_len positions of its fixed cache, with
    the layer's kept lists (module._llmk_decoder_kept, from the press's prefill) where it has them."""
    k = getattr(module, "_llmk_decoder_kept", None)
    kw = dict(kept_idx=k[1], kept_len=k[2], dense_from=k[3]) if k is not None else {}
    out, _ = masked_decode(query, key, value, kv_len=kwargs["llmk_kv_len"], sm_scale=scaling, **kw)
    return out.transpose(1, 2), None


class _FixedLayer(DynamicLayer):
    """A decode layer over preallocated [B, Hkv, capacity, D] buffers: update writes the new token at cache_position
    (a device tensor: CUDA-graph safe) and returns the whole buffers (PressDecoder's attention reads its length)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states, value_states, cache_kwargs=None, *args, **kwargs):
        pos = cache_kwargs["cache_position"]
        self.keys.index_copy_(2, pos, key_states)
        self.values.index_copy_(2, pos, value_states)
        return self.keys, self.values


class PressDecoder:
    """Greedy decoding from a prefill made under a kvpress press, one CUDA graph per step (graph=True, CUDA): the
    prefill's cache is copied into fixed buffers with room for max_new_tokens, each layer's press indices (and the
    prompt's padding) become masked_decode's kept lists once, and a step runs the model with masked_decode over the
    kept prompt tokens and every generated one. For presses that decide at prefill (AdaKVPress, CriticalAdaKVPress,
    KVzipPress, DuoAttentionPress, ...); presses that evict while decoding (DMSPress) need the press active at each
    step: use masked_decode_attention with generate.

        cache = DynamicCache(config=model.config)
        with torch.no_grad(), press(model):
            logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        dec = PressDecoder(model, cache, logits[:, -1].argmax(-1), max_new_tokens=64)
        tokens = dec.generate(64)  # [B, 64], the first being the token given

    model: a transformers decoder-only model (full-attention layers; the layers' attention modules carry kvpress's
    masked_key_indices); cache: its DynamicCache after the prefill; first: [B] the token after the prompt;
    attention_mask: the prompt's [B, T] (left padding; None: none). Positions continue from T, or with
    attention_mask from each sequence's count of real tokens, as generate's do (its prefill passes position_ids
    = attention_mask.cumsum(-1) - 1). compact: each (sequence, KV head)'s kept prompt tokens are moved to the front
    of its row and the buffers hold only as many as the row that keeps most (memory: that width, not the prompt's,
    plus max_new_tokens; masked_decode then reads each row's kept prefix as contiguous tiles, with no list);
    `length` counts cache positions (that width). compile: True (inductor) or a torch.compile backend name: the
    step's model forward under torch.compile (compiled on the first step: the norms, rotary, residual adds and MLP
    activation fused, as StaticDecoder's compile; the attention stays masked_decode).
    The prefill's cache is copied: delete it afterwards to free its memory."""

    def __init__(self, model, cache, first: torch.Tensor, max_new_tokens: int, attention_mask=None,
                 graph: bool = True, compact: bool = False, compile=False):
        check_int("max_new_tokens", max_new_tokens, lo=1)
        check_bool("graph", graph)
        check_bool("compact", compact)
        if not isinstance(compile, (bool, str)):
            raise TypeError(f"compile must be a bool or a torch.compile backend name, got {type(compile).__name__}")
        layers = getattr(cache, "layers", None)
        if not layers or not all(type(la) in (DynamicLayer, _GrowingLayer) and la.is_initialized for la in layers):
            raise ValueError("cache must be the prefill's DynamicCache (or GrowingCache) with every layer filled; "
                             "sliding-window layers are not supported")
        B, H, T, D = layers[0].keys.shape
        first = torch.as_tensor(first).reshape(-1)
        if first.shape[0] != B:
            raise ValueError(f"first must hold one token per sequence ({B}), got shape {tuple(first.shape)}")
        if attention_mask is not None and tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must be the prompt's [B={B}, T={T}], got {tuple(attention_mask.shape)}")
        self.model, self.graph = model, graph and torch.cuda.is_available()
        dev = layers[0].keys.device
        attns = {m.layer_idx: m for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)
                 and hasattr(m, "o_proj")}
        if sorted(attns) != list(range(len(layers))):
            raise ValueError(f"found attention modules for layers {sorted(attns)}, the cache has {len(layers)}")
        pad = None if attention_mask is None else (attention_mask.to(dev) == 0)[:, None, :].expand(B, H, T)
        lists = []
        for i in range(len(layers)):  # each layer's kept lists (None: nothing dropped)
            a = attns[i]
            idx = getattr(a, "masked_key_indices", None)
            a.__dict__.pop("_llmk_decoder_kept", None)
            drop = _dropped(idx, pad, B, H, T, dev)
            lists.append((idx, *kept_lists(drop)) if drop is not None else None)
        # compact: every row's kept tokens moved to its front, the buffers as wide as the longest row of any layer
        width = max(int(k[2].max()) if k is not None else T for k in lists) if compact else T
        fixed = []
        for la, k, a in zip(layers, lists, (attns[i] for i in range(len(layers)))):
            kb = la.keys.new_empty(B, H, width + max_new_tokens, D)
            vb = la.values.new_empty(B, H, width + max_new_tokens, D)
            if compact and k is not None:
                kb[:, :, :width], vb[:, :, :width] = compacted(la.keys, la.values, k[1], width)
                a._llmk_decoder_kept = (k[0], None, k[2], width)  # each row's first k[2]: a prefix, no list
            else:
                kb[:, :, :T], vb[:, :, :T] = la.keys, la.values
                if k is not None:
                    a._llmk_decoder_kept = (*k, T)
            fixed.append(_FixedLayer(kb, vb))
        self.cache = DynamicCache()
        self.cache.layers = fixed
        self.ids = first.to(dev, torch.long).view(B, 1).clone()
        real = attention_mask.to(dev).long().sum(-1) if attention_mask is not None else torch.full((B,), T, device=dev)
        self.position_ids = real.view(B, 1).clone()  # positions continue each sequence's own (padding not counted)
        self.cache_position = torch.full((1,), width, dtype=torch.long, device=dev)  # where the next token goes
        self.kv_len = torch.full((B,), width + 1, dtype=torch.int32, device=dev)  # read after the new token's write
        self.length, self.capacity = width, width + max_new_tokens
        self._graph = None
        _register()
        kw = {"backend": compile} if isinstance(compile, str) else {}
        self._next = self._run if not compile else torch.compile(self._run, dynamic=False, **kw)

    def _run(self):
        out = self.model(input_ids=self.ids, position_ids=self.position_ids, cache_position=self.cache_position,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1, llmk_kv_len=self.kv_len)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def _step(self) -> None:
        with _attention_implementation(self.model, GRAPH_NAME, "PressDecoder"):
            nxt = self._next()
        self.ids.copy_(nxt)
        for t in (self.position_ids, self.cache_position, self.kv_len):
            t.add_(1)

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Decode one token per sequence (the one after self.ids); returns self.ids [B, 1], updated in place."""
        if self.length >= self.capacity:
            raise RuntimeError(f"the cache is full ({self.capacity} positions: raise max_new_tokens)")
        if not self.graph:
            self._step()
        elif self._graph is None:
            self._graph = capture_step(self._step)  # its eager call is this step's decode
        else:
            self._graph.replay()
        self.length += 1
        return self.ids

    @torch.no_grad()
    def generate(self, new_tokens: int) -> torch.Tensor:
        """[B, new_tokens]: the token given, then new_tokens - 1 decoded greedily."""
        check_int("new_tokens", new_tokens, lo=1)
        out = [self.ids.clone()]
        for _ in range(new_tokens - 1):
            out.append(self.step().clone())
        return torch.cat(out, dim=1)
