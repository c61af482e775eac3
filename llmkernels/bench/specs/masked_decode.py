"""Benchmark cases and peers of masked_decode for `llmkernels bench` (its checks: llmkernels.ops.masked_decode)."""
import functools
import torch

from .. import Case, Impl, OpBench
from ..peers import compiled_flex, flex_available
from ...ops.masked_decode.op import kept_lists, masked_decode
from ...ops.masked_decode.reference import masked_decode_ref
from ...ops.masked_decode.spec import make_inputs


HKV, HQ, D = 8, 32, 128
SHAPES = [(1, 65536), (2, 65536), (4, 65536), (8, 65536), (32, 8192), (1, 1048576)]


def _bytes(B, L, kept, esize=2):
    kv = 2 * B * HKV * L * D * esize * kept
    return int(kv + 2 * B * HQ * D * esize + B * HKV * L)  # + q + out + mask


def _cases(quick):
    shapes = SHAPES[:1] + SHAPES[-2:-1] if quick else SHAPES
    cases = []
    for B, L in shapes:
        for kept in (1.0, 0.5):
            cases.append(Case(shape={"B": B, "Hkv": HKV, "Hq": HQ, "L": L, "D": D, "dtype": "fp16", "kept": kept},
                              make_inputs=functools.partial(make_inputs, B, HKV, HQ, L, D, torch.float16,
                                                            torch.device("cuda"), kept=kept), bytes=_bytes(B, L, kept),
                              flops=int(4 * B * HQ * L * D * kept), timing="graph", write_bytes=B * HQ * D * 2))
    return cases


def _ours(x):
    return lambda: masked_decode(x["q"], x["k"], x["v"], x["drop"])


def _ours_lists(x):
    """The same mask as kept lists (built outside the timed region, as a press builds them once after prefill)."""
    idx, n = kept_lists(x["drop"])
    return lambda: masked_decode(x["q"], x["k"], x["v"], kept_idx=idx, kept_len=n)


def _eager(x):
    return lambda: masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])


def _sdpa(x):
    import torch.nn.functional as F
    keep = (~x["drop"]).repeat_interleave(HQ // HKV, dim=1)[:, :, None, :]  # SDPA: True = attend
    q = x["q"][:, :, None, :]
    return lambda: F.scaled_dot_product_attention(q, x["k"], x["v"], attn_mask=keep, enable_gqa=True)


def _flex(x):
    from torch.nn.attention.flex_attention import create_block_mask
    flex = compiled_flex()
    drop = x["drop"]
    G = HQ // HKV
    B, _, L = drop.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return ~drop[b, h // G, kv_idx]

    bm = create_block_mask(mask_mod, B, HQ, 1, L, device="cuda")
    q = x["q"][:, :, None, :]
    return lambda: flex(q, x["k"], x["v"], block_mask=bm, enable_gqa=True)


def _flashinfer_available():
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return "flashinfer is not installed (pip install 'llmkernels[peers]')"
    return None


_PAGE = 16


def _flashinfer_decode(x):
    """FlashInfer's batch decode over a paged HND cache (16-token pages), planned here, outside the timed region.
    It has no per-token mask: it attends to every token (dense), so it is a peer of the kept=1.0 rows only."""
    import flashinfer
    q = x["q"]
    B, Hkv, L, D = x["k"].shape
    # [B, Hkv, L, D] -> pages [B * L / 16, Hkv, 16, D] (a serving engine's cache is paged already: not timed)
    pages = lambda t: t.reshape(B, Hkv, L // _PAGE, _PAGE, D).transpose(1, 2).reshape(-1, Hkv, _PAGE, D)  # noqa
    cache = (pages(x["k"]), pages(x["v"]))
    per_seq = L // _PAGE
    indptr = torch.arange(B + 1, dtype=torch.int32, device=q.device) * per_seq
    indices = torch.arange(B * per_seq, dtype=torch.int32, device=q.device)
    last = torch.full((B,), _PAGE, dtype=torch.int32, device=q.device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device=q.device),
                                                      kv_layout="HND")
    w.plan(indptr, indices, last, q.shape[1], Hkv, D, _PAGE, q_data_type=q.dtype, kv_data_type=q.dtype)
    return lambda: w.run(q, cache)


def _flashinfer_sparse(x):
    """FlashInfer's per-KV-head block-sparse attention with one-token column blocks: exactly the kept tokens. Batch
    folds into the heads (q [B * Hq, 1, D], k [B * Hkv, L, D], no copy); planned here, outside the timed region."""
    import flashinfer
    q, k, v, drop = x["q"], x["k"], x["v"], x["drop"]
    B, Hkv, L, D = k.shape
    keep = ~drop.reshape(B * Hkv, 1, L)
    w = flashinfer.VariableBlockSparseAttentionWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device=q.device))
    w.plan(keep, torch.ones(B * Hkv, 1, dtype=torch.int32, device=q.device),
           torch.ones(B * Hkv, L, dtype=torch.int32, device=q.device), B * q.shape[1], B * Hkv, D,
           q_data_type=q.dtype, kv_data_type=k.dtype)
    qf, kf, vf = q.reshape(-1, 1, D), k.reshape(B * Hkv, L, D), v.reshape(B * Hkv, L, D)
    return lambda: w.run(qf, kf, vf)


def benches():
    return [OpBench("masked_decode", _cases, [
        Impl("llmkernels", _ours),
        Impl("llmkernels-kept-lists", _ours_lists),
        Impl("torch-eager", _eager, max_bytes=3 << 30),
        Impl("sdpa-bool-mask", _sdpa),
        Impl("flex-attention", _flex, flex_available),
        Impl("flashinfer-decode-dense", _flashinfer_decode, _flashinfer_available),
        Impl("flashinfer-block-sparse", _flashinfer_sparse, _flashinfer_available),
    ])]
