"""Checks and benchmark cases for masked_decode (used by the CLI and scripts/gpu.sh)."""
import functools

import torch

from ...bench import Case, Impl, OpBench
from ...bench.peers import compiled_flex, flex_available
from ...checking import generator, result
from ..combine.op import merge_attention_states
from .op import masked_decode
from .reference import masked_decode_ref

# Output is rounded to fp16 (2^-11) / bf16 (2^-8) and P is rounded to that dtype before the PV
# product; the norm-wise relative error stays a few units of that rounding. lse is accumulated in fp32
# from exact products of the same inputs, so it matches the fp32 reference to ~1e-6.
OUT_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
LSE_TOL = 1e-4


def make_inputs(B, Hkv, Hq, L, D, dtype, device, kept=1.0, cache_len=None, seed=None):
    g = generator(device, seed)
    cache_len = cache_len or L
    q = torch.randn(B, Hq, D, dtype=dtype, device=device, generator=g)
    k = torch.randn(B, Hkv, cache_len, D, dtype=dtype, device=device, generator=g)[:, :, :L]
    v = torch.randn(B, Hkv, cache_len, D, dtype=dtype, device=device, generator=g)[:, :, :L]
    drop = torch.rand(B, Hkv, L, device=device, generator=g) >= kept
    return {"q": q, "k": k, "v": v, "drop": drop}


def check(device):
    out = []
    # the interpreter's bf16 dot is wrong: fp16 only on the CPU
    dtypes = [torch.float16] if device.type == "cpu" else [torch.float16, torch.bfloat16]
    for dtype in dtypes:
        for (B, Hkv, G, L, D) in [(2, 2, 4, 157, 64), (1, 1, 16, 300, 128), (3, 2, 1, 77, 256)]:
            x = make_inputs(B, Hkv, Hkv * G, L, D, dtype, device, kept=0.6)
            if B * Hkv > 1:
                x["drop"][-1, -1] = True  # one fully dropped (batch, kv head)
            lens = torch.randint(L // 2, L + 1, (B,), device=device, dtype=torch.int32)
            o, lse = masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=lens)
            ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], lens)
            case = f"B={B} Hkv={Hkv} G={G} L={L} D={D} {str(dtype)[6:]}"
            out.append(result("masked_decode", case + " out", o, ro, OUT_TOL[dtype]))
            out.append(result("masked_decode", case + " lse", lse, rl, LSE_TOL))
    # merge: shard the cache in three, merge the shard results, compare with the unsharded reference
    x = make_inputs(2, 2, 8, 190, 64, torch.float16, device, kept=0.7)
    parts = [masked_decode(x["q"], x["k"][:, :, a:b], x["v"][:, :, a:b], x["drop"][:, :, a:b])
             for a, b in [(0, 50), (50, 51), (51, 190)]]
    mo, ml = merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])
    out.append(result("merge_attention_states", "3 shards vs unsharded", mo, ro, OUT_TOL[torch.float16]))
    out.append(result("merge_attention_states", "3 shards lse", ml, rl, LSE_TOL))
    return out


# --- benchmarks -------------------------------------------------------------------------------

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
        Impl("torch-eager", _eager, max_bytes=3 << 30),
        Impl("sdpa-bool-mask", _sdpa),
        Impl("flex-attention", _flex, flex_available),
        Impl("flashinfer-decode-dense", _flashinfer_decode, _flashinfer_available),
        Impl("flashinfer-block-sparse", _flashinfer_sparse, _flashinfer_available),
    ])]
