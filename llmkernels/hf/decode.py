"""Greedy decoding of a transformers causal LM with a static KV cache, one CUDA graph per step (optional), and
llmkernels.masked_decode as the decode attention."""
import inspect
from typing import Optional

import torch

from .._runtime import capture_step
from .._validate import check_bool, check_int
from .._pdl import pdl_enabled
from ..ops.masked_decode.op import masked_decode
from ..ops.nvfp4.op import NVFP4Linear
from . import inkling
from .moe import host_routed

ATTN_NAME = "llmkernels_decode"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention function for transformers' AttentionInterface: one new token per sequence runs
    llmkernels.masked_decode over the first `llmk_kv_len` cache positions (a device int32 [B]: no host sync, CUDA
    graph safe); a longer query (the prefill, which starts at position 0 of the cache) runs causal SDPA."""
    kv_len = kwargs.get("llmk_kv_len")
    if kv_len is None:  # not called by StaticDecoder
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[2] == 1:
        out, _ = masked_decode(query, key, value, kv_len=kv_len, sm_scale=scaling)
        return out.transpose(1, 2), None
    T = query.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key[:, :, :T], value[:, :, :T], is_causal=True, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def greedy(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """logits [B, V] -> argmax [B] (the first index of the maximum), as two reductions: the maximum of each chunk,
    then the first chunk holding the largest. Compiled, a one-row argmax over a 128K vocabulary is a single
    latency-bound program (~28 us a step on the H100)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be a [B, V] tensor with V > 0, got {getattr(logits, 'shape', type(logits))}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    B, V = logits.shape
    n = -(-V // chunk)
    if n * chunk != V:
        logits = torch.nn.functional.pad(logits, (0, n * chunk - V), value=float("-inf"))
    v, i = logits.view(B, n, chunk).max(-1)
    j = v.argmax(-1, keepdim=True)
    return (i.gather(-1, j) + j * chunk).squeeze(-1)


def _register() -> None:
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, _attention)


class StaticDecoder:
    """Greedy decode of `batch` equal-length sequences with a transformers StaticCache of max_len positions.

    prefill(ids) runs the prompt (eager) and returns the first new token; step() decodes one token for every
    sequence; with graph=True (CUDA only) step() replays one CUDA graph captured on its first call. The decode
    attention is llmkernels.masked_decode over the valid cache positions (head dims 64, 128, 256): the model's
    attention implementation is switched to it during the decoder's own calls only. Sliding windows are not applied
    (contexts up to the window), except by attention patch_attention routes (Inkling: inkling_decode reads the
    window of full-length sliding layers). compile: True (inductor) or a torch.compile backend name: the decode
    step's forward is compiled on the first step, fusing the norms, rotary, residual adds and the MLP's activation
    (a Llama-3.1-8B shape, NVFP4, batch 1: 5.35 -> 3.65 ms a graph step on the H100; inductor's programmatic
    dependent launch on where the GPU has it, and its combo kernels for NVFP4 models); the prefill stays eager.
    Mixture-of-experts models decode in graphs where their routing stays on the device (hf.moe.Experts of tiled
    NVFP4 experts; transformers' grouped_mm / batched_mm experts); others need graph=False (ValueError).
    The next token is the argmax of the last logits (greedy).
    """

    def __init__(self, model, batch: int, max_len: int, graph: bool = True, compile=False):
        from transformers import StaticCache
        check_int("batch", batch, lo=1)
        check_int("max_len", max_len, lo=2)
        check_bool("graph", graph)
        self.model, self.batch, self.max_len = model, batch, max_len
        self.graph = graph and torch.cuda.is_available()
        self.device = model.get_input_embeddings().weight.device
        _register()
        self.cache = StaticCache(config=inkling.static_cache_config(model), max_cache_len=max_len)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.2x
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self.kv_len = torch.zeros(batch, dtype=torch.int32, device=self.device)
        self.length = 0  # tokens in the cache (host-side count)
        self._counts = None  # [layers + 1] int64: each layer's cache length and pos (see _share_lengths)
        self._decoding = False
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        if not isinstance(compile, (bool, str)):
            raise TypeError(f"compile must be a bool or a torch.compile backend name, got {type(compile).__name__}")
        if self.graph and host_routed(model, batch):
            raise ValueError("graph=True: this mixture-of-experts model routes its tokens on the host (transformers' "
                             "eager experts loop, or dense or untiled NVFP4 experts), which a CUDA graph cannot "
                             "capture; use graph=False")
        if compile and self.device.type == "cuda" and inkling.patched(model):
            # inductor (torch 2.11, H200) found no GEMM choice lowering this step (NoValidChoicesError); CPU compiles
            raise ValueError("compile is not supported for a patched Inkling model on CUDA yet: use graph=True "
                             "without compile")
        # the decode step's forward under torch.compile (its own fusions of norms, rotary, residuals and the MLP's
        # activation; compiled on the first step); the prefill stays eager. Inductor's kernels launch with PDL on
        # Hopper+, as llmkernels' do (8B-shaped step, H100: bf16 6.86 -> 6.47 ms, NVFP4 2.95 -> 2.77)
        kw = {"backend": compile} if isinstance(compile, str) else {}
        if kw.get("backend", "inductor") == "inductor" and self.device.type == "cuda" and pdl_enabled(self.device):
            kw["options"] = {"triton.enable_pdl": True}
            if any(isinstance(m, NVFP4Linear) for m in model.modules()):
                # combo kernels: the rotary / cache-write and cache-length kernels of a layer launched as one.
                # 8B-shaped step, H100: NVFP4 2.69 -> 2.63 ms; bf16 (cuBLAS linears) 6.41 -> 6.65, so off there
                kw["options"]["combo_kernels"] = True
        self._decode = self._run if not compile else torch.compile(self._run, dynamic=False, **kw)

    def _run(self, ids, position_ids):
        out = self.model(input_ids=ids, position_ids=position_ids, use_cache=True, logits_to_keep=1,
                         llmk_kv_len=self.kv_len, **{self._cache_kw: self.cache})
        return greedy(out.logits[:, -1])

    def _forward(self, ids, position_ids, decode: bool = False):
        cfg = self.model.config
        prev, cfg._attn_implementation = cfg._attn_implementation, ATTN_NAME
        self._decoding = decode
        try:
            return (self._decode if decode else self._run)(ids, position_ids)
        finally:
            cfg._attn_implementation = prev
            self._decoding = False

    def _share_lengths(self) -> None:
        """Once the cache's layers exist (after the first prefill): every layer's length (and a DSA layer's indexer
        length) becomes an element of one tensor with pos, and a decode step writes each layer's new rows at pos
        itself, so one add advances them all (transformers' StaticLayer.update adds to its own length: one 1-element
        kernel a layer and step, ~36 us of an 8B-shaped step on the H100). Only for layers as transformers'
        StaticLayer / StaticIndexedLayer have them (0-dim length tensors, 4-d keys and values, a 3-d indexer key
        cache); any other cache is left as it is."""
        layers = getattr(self.cache, "layers", None)
        known = bool(layers) and all(
            type(la).__name__ in ("StaticLayer", "StaticIndexedLayer")
            and isinstance(getattr(la, "cumulative_length", None), torch.Tensor)
            and la.cumulative_length.dim() == 0 and isinstance(getattr(la, "keys", None), torch.Tensor)
            and la.keys.dim() == 4 and isinstance(getattr(la, "values", None), torch.Tensor) for la in layers)
        if not known:
            return
        owners = [(la, "cumulative_length") for la in layers] + [
            (la, "indexer_cumulative_length") for la in layers if getattr(la, "is_indexer_initialized", False)
            and getattr(la, "indexer_keys", None) is not None and la.indexer_keys.dim() == 3]
        counts = torch.zeros(len(owners) + 1, dtype=torch.long, device=self.device)
        for i, (la, attr) in enumerate(owners):
            counts[i] = getattr(la, attr)
            setattr(la, attr, counts[i])
            if attr == "cumulative_length":
                la.update = self._layer_update(la)
            else:
                la.update_indexer = self._indexer_update(la)
        counts[-1] = self.pos.view(())
        self.pos, self._counts = counts[-1:].view(1, 1), counts

    def _layer_update(self, layer):
        cls_update = type(layer).update

        def update(key_states, value_states, *args, **kwargs):
            if not self._decoding:  # the prefill: transformers' own (which adds to the length)
                return cls_update(layer, key_states, value_states, *args, **kwargs)
            pos = self.pos.view(-1)  # one new token per sequence; the lengths advance in _step
            layer.keys.index_copy_(2, pos, key_states)
            layer.values.index_copy_(2, pos, value_states)
            return layer.keys, layer.values
        return update

    def _indexer_update(self, layer):
        cls_update = type(layer).update_indexer

        def update_indexer(key_states, *args, **kwargs):
            if not self._decoding:
                return cls_update(layer, key_states, *args, **kwargs)
            layer.indexer_keys.index_copy_(1, self.pos.view(-1), key_states)
            return layer.indexer_keys
        return update_indexer

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [batch, T] -> the next token of each sequence [batch]; resets the cache."""
        B, T = input_ids.shape
        if B != self.batch or not 0 < T < self.max_len:
            raise ValueError(f"input_ids must be [{self.batch}, T] with 0 < T < max_len={self.max_len}, "
                             f"got {list(input_ids.shape)}")
        self.cache.reset()
        self.kv_len.fill_(T)  # read by the decode attention when T == 1
        pos = torch.arange(T, device=self.device)[None]
        nxt = self._forward(input_ids.to(self.device), pos)
        self.ids.copy_(nxt[:, None])
        self.pos.fill_(T)
        if self._counts is None:
            self._share_lengths()
        self.kv_len.fill_(T + 1)  # the attention runs after the cache update: the new token is position T
        self.length = T
        return nxt

    def _step(self) -> None:
        nxt = self._forward(self.ids, self.pos, decode=True)
        self.ids.copy_(nxt[:, None])
        (self._counts if self._counts is not None else self.pos).add_(1)  # pos, and the layers' lengths with it
        self.kv_len.add_(1)

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Decode one token per sequence (the one after self.ids); returns self.ids [batch, 1], updated in place."""
        if self.length == 0:
            raise RuntimeError("call prefill(input_ids) before step()")
        if self.length + 1 >= self.max_len:
            raise RuntimeError(f"the static cache is full (max_len={self.max_len})")
        if not self.graph:
            self._step()
        elif self._graph is None:
            self._capture()  # its warm-up call decodes this step
        else:
            self._graph.replay()
        self.length += 1
        return self.ids

    def _capture(self) -> None:
        self._graph = capture_step(self._step)  # its eager call is this step's decode

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy: input_ids [batch, T] -> [batch, T + new_tokens] (new_tokens >= 1)."""
        check_int("new_tokens", new_tokens, lo=1)
        out = [input_ids.to(self.device), self.prefill(input_ids)[:, None]]
        for _ in range(new_tokens - 1):
            out.append(self.step().clone())
        return torch.cat(out, dim=1)
