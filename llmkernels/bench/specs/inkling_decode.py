"""Benchmark cases and peers of inkling_decode for `llmkernels bench` (its checks: llmkernels.ops.inkling_decode)."""
import torch

from .. import Case, Impl, OpBench
from ..peers import compiled_flex, flex_available
from ...ops.inkling_decode.spec import make_inputs, run

D = 128
# (B, Hq, Hkv, L, rel_extent, window): a tensor-parallel shard of a full layer (vLLM's published point: 4 query
# heads, 1 KV head), then Inkling's full layers (64 / 8) and sliding ones (64 / 16, window 512 = their extent)
SHAPES = ([(1, 4, 1, L, 1024, None) for L in (8192, 65536)]
          + [(B, 64, 8, L, 1024, None) for B in (1, 32) for L in (8192, 65536)]
          + [(B, 64, 16, L, 512, 512) for B in (1, 32) for L in (8192, 65536)])
QUICK = [(1, 4, 1, 8192, 1024, None), (1, 64, 16, 8192, 512, 512)]


def _bytes(B, Hq, Hkv, L, E, window, esize=2):
    n = L if window is None else min(L, window)  # keys attended: read once
    return 2 * B * Hkv * n * D * esize + B * Hq * min(E, n) * esize + 2 * B * Hq * D * esize + B * 4


def _cases(quick):
    cases = []
    for B, Hq, Hkv, L, E, window in (QUICK if quick else SHAPES):
        mk = lambda B=B, Hq=Hq, Hkv=Hkv, L=L, E=E, window=window: make_inputs(  # noqa: E731
            B, Hq, Hkv, D, L, E, "dense", torch.bfloat16, "cuda", window=window, L=L, strided=False)
        n = L if window is None else min(L, window)
        cases.append(Case(shape={"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "L": L, "rel_extent": E,
                                 "window": window or 0, "dtype": "bf16"},
                          make_inputs=mk, bytes=_bytes(B, Hq, Hkv, L, E, window), flops=4 * B * Hq * n * D,
                          timing="graph", write_bytes=B * Hq * D * 2))
    return cases


def _ours(x):
    return lambda: run(x, scale=1.0 / D)


def _flex(x):
    """FlexAttention on the same [B, Hkv, L, D] cache: the compact bias read by a score_mod at distance L - 1 - kv,
    the window as a block mask (blocks before it never read)."""
    from torch.nn.attention.flex_attention import create_block_mask
    flex = compiled_flex()
    q, k, v, rel = x["q"], x["k"], x["v"], x["rel_bias"]
    B, Hq, _ = q.shape
    L, E, window = k.shape[2], rel.shape[-1], x["window"]

    def score_mod(score, b, h, q_idx, kv_idx):
        d = (L - 1) - kv_idx
        return score + torch.where(d < E, rel[b, h, d.clamp(0, E - 1)].float(), 0.0)

    mask = None
    if window is not None:
        mask = create_block_mask(lambda b, h, q_idx, kv_idx: (L - 1) - kv_idx < window, None, None, 1, L,
                                 device=q.device)
    return lambda: flex(q[:, :, None, :], k, v, score_mod=score_mod, block_mask=mask, scale=1.0 / D,
                        enable_gqa=Hq != k.shape[1])


def _transformers_available():
    try:
        from transformers.models.inkling import modeling_inkling  # noqa: F401
    except ImportError as e:
        return f"transformers with Inkling not installed ({e})"
    return None


def _transformers(x):
    """transformers' own decode attention for Inkling: the bias gathered densely to [B, H, 1, L] (as
    InklingRelativeLogits does), eager_attention_forward (repeat_kv, matmuls); a sliding layer's cache holds only
    the window's keys (transformers' sliding cache layers), so it reads those."""
    from transformers.models.inkling.modeling_inkling import eager_attention_forward
    q, k, v, rel = x["q"], x["k"], x["v"], x["rel_bias"]
    B, Hq, _ = q.shape
    if x["window"] is not None:
        k, v = k[:, :, -x["window"]:], v[:, :, -x["window"]:]
    L, E = k.shape[2], rel.shape[-1]
    mod = torch.nn.Module()
    mod.num_key_value_groups, mod.training = Hq // k.shape[1], False

    def call():
        dist = (L - 1) - torch.arange(L, device=q.device)
        bias = rel.gather(-1, dist.clamp(0, E - 1).expand(B, Hq, L)).masked_fill(dist >= E, 0.0)[:, :, None]
        return eager_attention_forward(mod, q[:, :, None], k, v, None, 1.0 / D, position_bias=bias)[0]
    return call


def benches():
    return [OpBench("inkling_decode", _cases, [
        Impl("llmkernels", _ours),
        Impl("flex-attention", _flex, flex_available),
        Impl("transformers-eager", _transformers, _transformers_available, max_bytes=5 << 30),
    ])]
