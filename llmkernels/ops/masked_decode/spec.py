"""Checks of masked_decode: inputs, tolerances, check(device); benchmarks in llmkernels.bench.specs.masked_decode."""

import torch

from ...checking import generator, result
from ..combine.op import merge_attention_states
from .op import kept_lists, masked_decode
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
            # the same tokens as kept lists of the first 3/4 of the cache, the rest kept (dense_from)
            cut = 3 * L // 4
            idx, n = kept_lists(x["drop"][:, :, :cut].contiguous())
            mask = x["drop"].clone()
            mask[:, :, cut:] = False
            o, lse = masked_decode(x["q"], x["k"], x["v"], kv_len=lens, kept_idx=idx, kept_len=n, dense_from=cut)
            ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], mask, lens)
            out.append(result("masked_decode", case + " kept lists out", o, ro, OUT_TOL[dtype]))
            out.append(result("masked_decode", case + " kept lists lse", lse, rl, LSE_TOL))
    # merge: shard the cache in three, merge the shard results, compare with the unsharded reference
    x = make_inputs(2, 2, 8, 190, 64, torch.float16, device, kept=0.7)
    parts = [masked_decode(x["q"], x["k"][:, :, a:b], x["v"][:, :, a:b], x["drop"][:, :, a:b])
             for a, b in [(0, 50), (50, 51), (51, 190)]]
    mo, ml = merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"])
    out.append(result("merge_attention_states", "3 shards vs unsharded", mo, ro, OUT_TOL[torch.float16]))
    out.append(result("merge_attention_states", "3 shards lse", ml, rl, LSE_TOL))
    return out
