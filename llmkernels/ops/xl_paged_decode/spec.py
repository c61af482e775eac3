"""Checks of xl_paged_decode: inputs, tolerances, check(device) (benchmarks: bench.specs.xl_paged_decode)."""
import math

import torch

from ...checking import generator, result
from .op import xl_paged_decode
from .reference import xl_paged_decode_ref

# The output is rounded to fp16 (2^-11) / bf16 (2^-8), and so are (q + u) and P before the two tensor-core
# products; the norm-wise relative error stays a few units of that rounding. fp32 runs the products in
# IEEE fp32 (only summation order differs from the reference). lse sums fp32 exponentials of logits whose
# error is the (q + u) rounding times |k|: ~1e-3 absolute on logits of size ~3 -> relative ~1e-3 (bf16 ~8x).
OUT_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
LSE_TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def make_inputs(S, H, Hkv, D, block_size, contexts, layout="nhd", dtype=torch.float16, device="cpu",
                u="head", bd="strided", extra_blocks=3, garbage=True, table_pad=1, seed=None):
    """Random paged-decode inputs. contexts: list of S lengths (or one int for all).

    Blocks are drawn in shuffled order from a cache with `extra_blocks` unused blocks; the table has
    `table_pad` columns past the longest context, and (garbage=True) entries past each sequence's used
    blocks hold out-of-range ids (never read). u: None, "head" ([H, D]) or "seq" ([S, H, D]);
    bd: None, "contig" or "strided" (a non-contiguous view with a non-unit last stride).
    """
    device = torch.device(device)
    g = generator(device, seed)
    contexts = [contexts] * S if isinstance(contexts, int) else list(contexts)
    used = [math.ceil(c / block_size) for c in contexts]
    max_blocks = max(used + [0]) + table_pad
    nb = sum(used) + extra_blocks
    rand = lambda *shape: torch.randn(*shape, device=device, generator=g).to(dtype)  # noqa: E731
    k = rand(nb, block_size, Hkv, D)
    v = rand(nb, block_size, Hkv, D)
    perm = torch.randperm(nb, device=device, generator=g).to(torch.int32)
    table = torch.full((S, max_blocks), 0, dtype=torch.int32, device=device)
    if garbage:  # out-of-range ids, negative and huge, past the used blocks
        junk = torch.randint(nb, 2 ** 31 - 1, (S, max_blocks), device=device, generator=g, dtype=torch.int32)
        table = torch.where(torch.rand(S, max_blocks, device=device, generator=g) < 0.5, junk, -junk)
    i = 0
    for s, n in enumerate(used):
        table[s, :n] = perm[i:i + n]
        i += n
    if layout == "legacy":
        x = 16 // k.element_size()
        k_cache = k.view(nb, block_size, Hkv, D // x, x).permute(0, 2, 3, 1, 4).contiguous()
        v_cache = v.permute(0, 2, 3, 1).contiguous()
    else:
        k_cache, v_cache = k, v
    L = max(contexts + [0])
    x = {"q": rand(S, H, D), "k_cache": k_cache, "v_cache": v_cache, "block_tables": table,
         "context_lens": torch.tensor(contexts, dtype=torch.int32, device=device), "u": None, "bd": None}
    if u == "head":
        x["u"] = rand(H, D)
    elif u == "seq":
        x["u"] = rand(S, H, D)
    if bd == "contig":
        x["bd"] = rand(S, H, L)
    elif bd == "strided":
        x["bd"] = rand(S, L + 5, H, 2).permute(0, 2, 1, 3)[:, :, :L, 0]  # strides (.., 2, 2H)
    return x


def run(x, **kw):
    return xl_paged_decode(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"],
                           u=x["u"], bd=x["bd"], **kw)


def ref(x, **kw):
    return xl_paged_decode_ref(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"],
                               u=x["u"], bd=x["bd"], **kw)


def check(device):
    out = []
    # the interpreter's bf16 dot is wrong: CPU checks fp16/fp32, the GPU adds bf16
    dtypes = [torch.float16, torch.float32] if device.type == "cpu" else [torch.float16, torch.bfloat16, torch.float32]
    cases = [  # S, H, Hkv, D, block_size, contexts, layout, u, bd
        (3, 4, 2, 64, 16, [37, 1, 0], "nhd", "head", "strided"),
        (2, 4, 4, 80, 8, [50, 21], "legacy", "seq", "contig"),
        (2, 8, 1, 128, 32, [70, 33], "legacy", None, "strided"),
    ]
    for dtype in dtypes:
        for S, H, Hkv, D, bs, ctx, layout, u, bd in cases:
            x = make_inputs(S, H, Hkv, D, bs, ctx, layout, dtype, device, u=u, bd=bd)
            o, lse = run(x, return_lse=True)
            ro, rl = ref(x)
            case = f"S={S} H={H} Hkv={Hkv} D={D} bs={bs} {layout} u={u} bd={bd} {str(dtype)[6:]}"
            out.append(result("xl_paged_decode", case + " out", o, ro, OUT_TOL[dtype]))
            out.append(result("xl_paged_decode", case + " lse", lse, rl, LSE_TOL[dtype]))
    return out
