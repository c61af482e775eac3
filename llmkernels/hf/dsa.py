"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) in transformers on llmkernels.sparse_mla.

The patched attention runs MLA in its absorbed form: each head's no-rope query is taken into the 512-wide latent
through the kv up-projection (W_UK), attention runs over the 576-wide latent rows (512 normalised latent + 64 rope)
with `sparse_mla` on the indexer's top-k, and the output is taken back through W_UV. The cache holds one latent row
per token and layer (as the cache layer's keys, its values zero-wide; plus the indexer's key), never the per-head
expanded keys and values, and the indexer keeps a running top-k over key chunks (dsa_index_scores) instead of an
S x T score tensor. Shapes: kv_lora_rank 512, qk_rope_head_dim 64 (the kernel's row); any head count, nope / v head
dims and index_topk.
"""
import sys
import weakref

import torch

from ..ops.dsa_indexer import dsa_index_scores, dsa_topk_logits
from ..ops.nvfp4.format import nvfp4_dequantize
from ..ops.nvfp4.op import NVFP4Linear
from ..ops.row_topk import row_topk
from ..ops.sparse_mla.op import indexer_kl_loss, sparse_mla

KNOWN = ("DeepseekV32Attention", "GlmMoeDsaAttention")  # transformers' DSA attention classes
# the rotary each indexer applies to its q / k (transformers 5.17-5.24): half-split, or GLM's interleaved pairs
INDEXER_ROPE = {"DeepseekV32Indexer": "apply_rotary_pos_emb", "GlmMoeDsaIndexer": "apply_rotary_pos_emb_interleave"}
LATENT, ROPE = 512, 64  # sparse_mla's 576-wide kv row: the normalised latent, then the rope key
CHUNK_BYTES = 256 << 20  # the indexer's fp32 scores of one (query tile, key chunk): [B, rows, keys]
ROW_TOPK_ROWS = 64  # up to this many score rows take row_topk (five launches); more (prefill) torch.topk


def patch_module(name: str, mod, indexer_loss: bool = False) -> None:
    """Route one DSA attention module through llmkernels (ValueError where its dims do not fit sparse_mla's row).
    indexer_loss: see patch_attention."""
    if mod.kv_lora_rank != LATENT or mod.qk_rope_head_dim != ROPE:
        raise ValueError(f"{name}: kv_lora_rank={mod.kv_lora_rank}, qk_rope_head_dim={mod.qk_rope_head_dim}; "
                         f"sparse_mla attends over {LATENT} + {ROPE}-wide latent rows")
    if getattr(mod, "q_a_proj", None) is None:
        raise ValueError(f"{name}: no q_a_proj (q_lora_rank None); the indexer reads the q_a latent")
    mod.llmk_indexer_loss, mod.llmk_loss = indexer_loss, None


def indexer_loss(model: torch.nn.Module) -> torch.Tensor:
    """The sum over layers of the DSA indexer objective their last training forward computed (patch_attention's
    indexer_loss=True); each is dropped once read. Add it to the language-model loss: its gradient reaches the
    indexers' weights only. RuntimeError where no layer computed one."""
    losses = []
    for mod in model.modules():
        if getattr(mod, "llmk_loss", None) is not None:
            losses.append(mod.llmk_loss)
            mod.llmk_loss = None
    if not losses:
        raise RuntimeError("no indexer loss to read: patch_attention(model, indexer_loss=True), then a forward with "
                           "gradients enabled")
    return torch.stack(losses).sum()


def _indexer_qk(indexer, hidden_states, q_resid, position_embeddings):
    """The indexer's queries [B, S, heads, d] and keys [B, S, d] of these tokens, rotary applied, as transformers'
    indexer computes them."""
    B, S, _ = hidden_states.shape
    nh, hd, rope = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    q_rot, q_pass = torch.split(indexer.wq_b(q_resid).view(B, S, nh, hd), [rope, hd - rope], dim=-1)
    k_rot, k_pass = torch.split(indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2), [rope, hd - rope], dim=-1)
    cos, sin = position_embeddings
    q_rot, k_rot = _fn(indexer, INDEXER_ROPE[type(indexer).__name__])(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1).squeeze(2)


def _index_logits(indexer, hidden_states, q_resid, position_embeddings, topk):
    """The indexer's scores [B, S, topk] fp32 at the selected keys (0 at -1) of a forward without cached tokens,
    with gradients to the indexer's weights: sum_h w_h relu(q_h . k * d^-0.5), as it selects (dsa_topk_logits:
    nothing [S, heads, topk] held for the backward)."""
    q, k = _indexer_qk(indexer, hidden_states, q_resid, position_embeddings)
    w = _weights_proj(indexer, hidden_states) * indexer.n_heads ** -0.5
    return dsa_topk_logits(q, k, w, topk, indexer.softmax_scale)


def _weights_proj(indexer, x):
    """The indexer's per-head weights [B, S, heads] (fp32 as transformers computes them, before n_heads^-0.5); an
    NVFP4 weights_proj takes x as it is."""
    lin = indexer.weights_proj
    return lin(x.to(lin.weight.dtype) if isinstance(lin, torch.nn.Linear) else x).float()


def _fn(mod, name):
    """A function of the model's own transformers module (its rotary helpers): the same code as its eager path."""
    return getattr(sys.modules[type(mod).__module__], name)


def _absorbed(self, dtype):
    """(W_UK [H, nope, 512], W_UV [H, v, 512]) from kv_b_proj; an NVFP4 kv_b_proj is dequantized to dtype once
    (inference weights: kept until its buffers change)."""
    lin = self.kv_b_proj
    if isinstance(lin, NVFP4Linear):
        key = (lin.packed.data_ptr(), lin.packed._version, lin.global_scale._version, dtype)
        if getattr(lin, "_llmk_dense", (None,))[0] != key:
            lin._llmk_dense = (key, nvfp4_dequantize(*lin.plain_weight(), lin.global_scale, dtype=dtype))
        w = lin._llmk_dense[1]
    else:
        w = lin.weight.to(dtype)
    w = w.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, LATENT)
    return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]


class Visible:
    """The keys each query may see, chunk by chunk: from the 4-d mask transformers built, or, without one (no
    padding under SDPA, or StaticDecoder's attention), causal by position: key t for the query at position p when
    t <= p (a static cache's rows past the written ones are never read); without positions, the queries are the
    last S of T. Never a [B, S, T] tensor of its own."""

    def __init__(self, attention_mask, position_ids, S, T, device):
        self.S, self.T, self.device, self._last = S, T, device, None
        src = attention_mask if attention_mask is not None else position_ids  # what the bounds derive from
        self._src = None if src is None else (weakref.ref(src), src._version, S, T)
        self.mask = self.pos = None
        if attention_mask is not None:
            m = attention_mask[:, 0] if attention_mask.dim() == 4 else attention_mask
            self.mask = m if m.dtype == torch.bool else m == 0
        elif position_ids is None:
            self.pos = torch.arange(S, device=device)[None] + (T - S)
            self._last = list(range(T - S, T))
        else:
            self.pos = position_ids.reshape(-1, S)

    def chunk(self, s0, s1, t0, t1) -> torch.Tensor:
        """[B or 1, s1 - s0, t1 - t0] bool."""
        if self.mask is not None:
            return self.mask[:, s0:s1, t0:t1]
        return torch.arange(t0, t1, device=self.device).view(1, 1, -1) <= self.pos[:, s0:s1, None]

    def last(self, s1):
        """A host bound on the last key rows :s1 see (None: not known without a sync, or not worth one: a decode
        step, or under torch.compile). Once a prefill layer: from the positions, or the mask's last visible key per
        row (row chunks, one sync)."""
        if self._last is None and self.S > 1 and not torch.compiler.is_compiling():
            memo = _LAST_MEMO.get("last")
            if memo is not None and self._src is not None and memo[0][0]() is not None and \
                    memo[0][0]() is self._src[0]() and memo[0][1:] == self._src[1:]:
                # the forward's other layers: the same mask (held weakly), one sync a forward
                self._last = memo[1]
                return self._last[s1 - 1]
            if self.mask is not None:
                m = self.mask.any(0) if self.mask.shape[0] > 1 else self.mask[0]  # [S, T]
                idx = torch.arange(m.shape[-1], device=m.device, dtype=torch.int32)
                rows = max(1, (64 << 20) // (4 * m.shape[-1]))
                per_row = torch.cat([torch.where(m[r:r + rows], idx, -1).amax(-1) for r in range(0, self.S, rows)])
            else:
                per_row = self.pos.amax(0)
            self._last = torch.cummax(per_row, 0).values.tolist()
            if self._src is not None:
                _LAST_MEMO["last"] = (self._src, self._last)
        return None if self._last is None else self._last[s1 - 1]


_LAST_MEMO = {}  # the last Visible.last computation: (its mask or positions and their version, S, T), its bounds


@torch.no_grad()
def indexer_topk(indexer, hidden_states, q_resid, position_embeddings, valid, cache=None, chunk_bytes=CHUNK_BYTES):
    """The DSA indexer's top-k key positions [B, S, topk] int32, unordered (-1 in place of the missing where a query
    sees fewer than topk keys), as transformers' DeepseekV32Indexer selects them (index_score = sum_h w_h relu(q_h .
    k * d^-0.5)), without its [B, S, heads, T] products or [B, S, T] scores: llmkernels.dsa_index_scores on query
    tiles against key chunks, a running top-k, keys past a tile's last visible one never scored. valid: a Visible,
    or [B, S, T] bool; the new keys go to `cache`. Equal scores (several keys at 0 from the ReLU) may be broken
    otherwise than transformers does: either is a top-k."""
    B, S, _ = hidden_states.shape
    q, k = _indexer_qk(indexer, hidden_states, q_resid, position_embeddings)
    if cache is not None:
        k = cache.update_indexer(k, indexer.layer_idx)
    T = k.shape[1]
    if isinstance(valid, torch.Tensor):
        valid = Visible(valid, None, S, T, k.device)
    w = _weights_proj(indexer, hidden_states) * indexer.n_heads ** -0.5
    pos = valid.pos if valid.mask is None else None
    topk = min(indexer.index_topk, T)
    rows = max(1, min(S, chunk_bytes // max(1, 4 * B * min(T, 1 << 16))))  # scores [B, rows, cols] fp32
    cols = max(topk, min(T, chunk_bytes // max(1, 4 * B * rows)))
    out = None  # [B, S, topk] int32, -1 where nothing is picked (made where a result is not one row_topk's)
    for s0 in range(0, S, rows):
        s1 = min(S, s0 + rows)
        last = valid.last(s1)
        end = T if last is None else max(0, min(T, last + 1))
        best_v = best_i = None
        for t0 in range(0, end, cols):
            t1 = min(end, t0 + cols)
            sc = dsa_index_scores(q[:, s0:s1], k, w[:, s0:s1], indexer.softmax_scale,
                                  None if pos is None else pos[:, s0:s1], t0, t1)
            if valid.mask is not None:
                sc = sc.masked_fill_(~valid.chunk(s0, s1, t0, t1), float("-inf"))
            if t0 == 0 and t1 == end and B * (s1 - s0) <= ROW_TOPK_ROWS:  # the only chunk of a few rows (decode)
                n = min(topk, t1)
                picked = row_topk(sc.view(-1, t1), n).view(B, s1 - s0, n)
                if s1 - s0 == S and n == topk:  # the whole result (a decode step's): no fill, no copy
                    return picked
                out = _filled(out, B, S, topk, sc.device)
                out[:, s0:s1, :n] = picked
                continue
            if best_v is None and t0 == 0:  # the first chunk: its picks are the positions
                best_v, best_i = sc.topk(min(topk, sc.shape[-1]), dim=-1, sorted=False)
                continue
            idx = torch.arange(t0, t1, device=sc.device).expand_as(sc)
            if best_v is not None:
                sc, idx = torch.cat([best_v, sc], -1), torch.cat([best_i, idx], -1)
            best_v, pick = sc.topk(min(topk, sc.shape[-1]), dim=-1, sorted=False)
            best_i = idx.gather(-1, pick)
        out = _filled(out, B, S, topk, hidden_states.device)
        if best_v is not None:  # fewer than topk columns where the tile sees fewer keys: the rest stay -1
            n = best_v.shape[-1]
            out[:, s0:s1, :n] = torch.where(best_v == float("-inf"), -1, best_i).to(torch.int32)
    return _filled(out, B, S, topk, hidden_states.device)


def _filled(out, B, S, topk, device):
    """out, or a new [B, S, topk] int32 of -1."""
    return out if out is not None else torch.full((B, S, topk), -1, dtype=torch.int32, device=device)


def _forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None, position_ids=None,
             prev_topk_indices=None, **kwargs):
    """DeepseekV32Attention / GlmMoeDsaAttention.forward through sparse_mla (see the module's doc)."""
    if self.training and getattr(self, "attention_dropout", 0.0) > 0:
        raise ValueError(f"attention_dropout={self.attention_dropout}: the patched DSA attention has no dropout "
                         "(DeepSeek-V3.2 and GLM-5 train with 0); set config.attention_dropout = 0.0")
    cache = kwargs.pop("cache", None)  # renamed from past_key_values in transformers 5.2x; a Cache's truth is its
    if cache is None:                  # length, so no `or`
        cache = past_key_values
    B, S, _ = hidden_states.shape
    H, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q = self.q_b_proj(q_resid).view(B, S, H, nope + rope).transpose(1, 2)  # [B, H, S, 192]
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)
    c, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [LATENT, rope], dim=-1)
    c = self.kv_a_layernorm(c).view(B, 1, S, LATENT)
    cos, sin = position_embeddings
    q_rot, k_rot = _fn(self, "apply_rotary_pos_emb_interleave")(q_rot, k_rot.view(B, 1, S, rope), cos, sin)
    kv = torch.cat([c, k_rot], dim=-1)  # [B, 1, S, 576]: sparse_mla's row
    if cache is not None:  # the rows as the layer's keys (its values zero-wide): read in place, never concatenated
        kv = cache.update(kv, kv[..., :0], self.layer_idx)[0]
    T = kv.shape[2]
    valid = Visible(attention_mask, position_ids, S, T, hidden_states.device)
    if getattr(self, "indexer", None) is not None:
        topk = indexer_topk(self.indexer, hidden_states, q_resid, position_embeddings, valid, cache)
    elif prev_topk_indices is None:
        raise ValueError("Shared DSA layers require top-k indices from a previous full indexer layer.")
    else:
        topk = prev_topk_indices
    w_uk, w_uv = _absorbed(self, q_nope.dtype)
    q_lat = torch.einsum("bhsd,hdc->bshc", q_nope, w_uk)
    q_abs = torch.cat([q_lat, q_rot.transpose(1, 2)], dim=-1).reshape(B * S, H, LATENT + rope)
    kv = kv.reshape(B * T, 1, LATENT + rope)
    if B == 1:  # (the rows of one sequence are kv's rows: no offset, no kernels for it)
        indices = topk.reshape(S, -1)
    else:
        offset = (torch.arange(B, device=topk.device, dtype=torch.int32) * T).view(B, 1, 1)
        indices = torch.where(topk >= 0, topk + offset, -1).reshape(B * S, -1)
    o_lat, _, lse = sparse_mla(q_abs, kv, indices, self.scaling)
    if getattr(self, "llmk_indexer_loss", False) and torch.is_grad_enabled() and \
            getattr(self, "indexer", None) is not None:
        if T != S:
            raise ValueError("indexer_loss: a training forward has no cached tokens (use_cache=False)")
        logits = _index_logits(self.indexer, hidden_states.detach(), q_resid.detach(), position_embeddings, topk)
        self.llmk_loss = indexer_kl_loss(logits.reshape(B * S, -1), q_abs.detach(), kv.detach(), indices,
                                         lse.detach(), self.scaling)
    o_lat = o_lat.view(B, S, H, LATENT)
    o = torch.einsum("bshc,hdc->bshd", o_lat, w_uv).reshape(B, S, H * self.v_head_dim)
    out = self.o_proj(o)
    return (out, None, topk) if hasattr(self, "skip_topk") else (out, None)
