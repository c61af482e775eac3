"""Checks of nvfp4_gemv, nvfp4_linear and nvfp4_moe: inputs, tolerances, check(device) (benchmarks:
bench.specs.nvfp4_gemv, bench.specs.nvfp4_moe)."""
import torch

from ...checking import generator, result
from .format import nvfp4_dequantize, nvfp4_quantize
from .linear import dequant_launch
from .moe import nvfp4_moe
from .moe_reference import nvfp4_moe_ref
from .op import NVFP4Linear, nvfp4_gemv, nvfp4_linear
from .reference import nvfp4_gemv_ref, nvfp4_linear_ref
from .tiled_layout import tile_packed, tile_scales

# GEMV: every block term a*sfa*b*sfb/.. is exact in fp32 and blocks are summed in fp32 (relative error ~1e-7);
# the output is rounded once to fp16 (relative 2^-11 = 4.9e-4 per element), so 1e-3 norm-wise.
GEMV_TOL = 1e-3
# linear: decoded weights are exact in x's dtype, products exact in fp32, fp32 accumulation; the output is
# rounded to x's dtype (2^-11 fp16, 2^-8 bf16). Above 16 tokens W * global_scale is rounded to x's dtype once
# more before cuBLAS, doubling the rounding term.
LINEAR_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
# moe: x, the gate / up outputs and h round to the dtype (the reference rounds the same three), down sums in fp32
MOE_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def random_scales(shape, device, lo=0x00, hi=0x7E, signed=False, generator=None):
    """float8_e4m3fn scales from random bytes in [lo, hi] (0x7e = 448 is the largest finite value)."""
    b = torch.randint(lo, hi + 1, shape, dtype=torch.uint8, device=device, generator=generator)
    if signed:
        b |= torch.randint(0, 2, shape, dtype=torch.uint8, device=device, generator=generator) << 7
    return b.view(torch.float8_e4m3fn)


def make_inputs(M, K, L, device, n_pad=128, full_range=True, scale_bytes=(0x30, 0x40), seed=None):
    """GPU MODE layout: a [M, K/2, L], b [n_pad, K/2, L] float4_e2m1fn_x2 with L outermost in memory;
    sfa [M, K/16, L], sfb [n_pad, K/16, L] float8_e4m3fn; c [M, 1, L] fp16 (NaN-poisoned).

    full_range: random bytes (all 16 codes, both signs); else the contest's codes 0..3 in the low nibble only.
    scale_bytes: e4m3 byte range of the scales (default 0x30..0x40 = 0.5..2, which keeps outputs finite).
    """
    g = generator(device, seed)
    hi_code = 256 if full_range else 4
    a = torch.randint(0, hi_code, (L, M, K // 2), dtype=torch.uint8, device=device, generator=g).permute(1, 2, 0)
    b = torch.randint(0, hi_code, (L, n_pad, K // 2), dtype=torch.uint8, device=device, generator=g).permute(1, 2, 0)
    lo, hi = scale_bytes
    sfa = random_scales((L, M, K // 16), device, lo, hi, generator=g).permute(1, 2, 0)
    sfb = random_scales((L, n_pad, K // 16), device, lo, hi, generator=g).permute(1, 2, 0)
    c = torch.full((L, M, 1), float("nan"), dtype=torch.float16, device=device).permute(1, 2, 0)
    return {"a": a.view(torch.float4_e2m1fn_x2), "b": b.view(torch.float4_e2m1fn_x2), "sfa": sfa, "sfb": sfb, "c": c}


def make_linear_inputs(T, N, K, dtype, device, bias=True, seed=None):
    g = generator(device, seed)
    w = torch.randn(N, K, device=device, generator=g) * 0.02
    packed, scales, gs = nvfp4_quantize(w)
    x = torch.randn(T, K, device=device, generator=g).to(dtype)
    bvec = torch.randn(N, device=device, generator=g) if bias else None
    return {"x": x, "packed": packed, "scales": scales, "gs": gs, "bias": bvec}


def moe_routing(T, E, k, device, seed=None):
    """[T, k] int32: k distinct experts per token, uniformly (as a router's top-k of random scores)."""
    g = generator(device, seed)
    return torch.rand(T, E, device=device, generator=g).topk(k, dim=1).indices.to(torch.int32)


def make_moe_inputs(T, E, H, I, k, dtype, device, seed=None, idx=None, plain=False):
    """x [T, H], top_k_index (idx, or moe_routing's), top_k_weights [T, k] in dtype, and the gate / up / down stacks
    (packed, scales, global scales) in the tiled layout from random codes, scales of 0.5-1 and global scales giving
    weights of rms ~0.02; plain=True adds "plain": the same stacks in the plain layout (for the reference)."""
    g = generator(device, seed)
    x = {"x": torch.randn(T, H, device=device, generator=g).to(dtype),
         "idx": idx if idx is not None else moe_routing(T, E, k, device, seed),
         "w": torch.rand(T, k, device=device, generator=g).to(dtype), "plain": []}
    for name, (N, K) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
        p = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, device=device, generator=g)
        s = random_scales((E, N, K // 16), device, 0x30, 0x38, generator=g)
        gs = torch.full((E,), 0.02 / (2.93 * 0.75), device=device) * (1 + torch.rand(E, device=device, generator=g))
        x[name] = (tile_packed(p.view(E * N, K // 2)).view(E, N, K // 2),
                   tile_scales(s.view(E * N, K // 16)).view(E, N, K // 16), gs)
        if plain:
            x["plain"].append((p, s, gs))
    return x


def check(device):
    out = []
    gpu = device.type == "cuda"
    shapes = [(37, 160, 3), (64, 512, 1), (5, 32, 2)]
    if gpu:
        shapes += [(2432, 4608, 2), (7168, 2048, 4), (128, 256, 1)]
    for M, K, L in shapes:
        x = make_inputs(M, K, L, device, n_pad=3 if not gpu else 128)
        c = nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"])
        out.append(result("nvfp4_gemv", f"M={M} K={K} L={L} all codes", c, nvfp4_gemv_ref(x["a"], x["b"], x["sfa"],
                                                                                        x["sfb"]), GEMV_TOL))
        x = make_inputs(M, K, L, device, n_pad=2, full_range=False, scale_bytes=(0x00, 0x7E))  # contest codes
        alpha = 2.0 ** -12  # full-range scales: keep the outputs inside fp16
        c = nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], alpha=alpha)
        out.append(result("nvfp4_gemv", f"M={M} K={K} L={L} e4m3 range", c,
                          nvfp4_gemv_ref(x["a"], x["b"], x["sfa"], x["sfb"], alpha), GEMV_TOL))
    dtypes = [torch.float16, torch.bfloat16] if gpu else [torch.float16]
    for dtype in dtypes:
        for T, N, K in [(1, 96, 160), (4, 200, 256), (16, 64, 512), (33, 80, 128)]:
            x = make_linear_inputs(T, N, K, dtype, device)
            y = nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
            ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
            out.append(result("nvfp4_linear", f"T={T} N={N} K={K} {str(dtype)[6:]}", y, ref, LINEAR_TOL[dtype]))
    for dtype in dtypes:  # NVFP4Linear on the tiled layout
        for T, N, K in [(1, 32, 256), (5, 48, 512), (16, 64, 768), (20, 16, 256)]:
            x = make_linear_inputs(T, N, K, dtype, device)
            m = NVFP4Linear(K, N, bias=True, device=device)
            m.set_weight(x["packed"], x["scales"])
            m.global_scale.copy_(x["gs"].reshape(1))
            m.bias.copy_(x["bias"])
            ref = nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"], x["bias"])
            out.append(result("nvfp4_linear", f"NVFP4Linear tiled T={T} N={N} K={K} {str(dtype)[6:]}", m(x["x"]), ref,
                              LINEAR_TOL[dtype]))
    for dtype in dtypes:  # a MoE layer's experts, one dropped slot
        for T, E, H, I, k in [(1, 4, 256, 256, 2), (5, 6, 512, 256, 3)] + ([(16, 16, 1024, 512, 4)] if gpu else []):
            x = make_moe_inputs(T, E, H, I, k, dtype, device, plain=True)
            x["idx"][0, -1] = E
            ref = nvfp4_moe_ref(x["x"], x["idx"], x["w"], *x["plain"])
            out.append(result("nvfp4_moe", f"T={T} E={E} H={H} I={I} k={k} {str(dtype)[6:]}",
                              nvfp4_moe(x["x"], x["idx"], x["w"], x["gate"], x["up"], x["down"]), ref, MOE_TOL[dtype]))
    x = make_linear_inputs(1, 70, 96, torch.float16, device)
    w = torch.empty(70, 96, dtype=torch.float16, device=device)
    dequant_launch(x["packed"], x["scales"].view(torch.uint8), x["gs"].reshape(1), w)
    out.append(result("nvfp4_dequantize", "Triton kernel vs torch", w,
                      nvfp4_dequantize(x["packed"], x["scales"], x["gs"]), 2 ** -11))  # one fp16 rounding
    return out
