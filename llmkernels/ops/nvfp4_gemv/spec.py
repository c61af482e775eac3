"""Checks and benchmark cases for nvfp4_gemv and nvfp4_linear (used by the CLI and scripts/gpu.sh)."""
import torch

from ...bench import Case, Impl, OpBench
from ...checking import generator, result
from .format import E2M1_VALUES, nvfp4_dequantize, nvfp4_quantize, to_blocked
from .linear import dequant_launch
from .op import NVFP4Linear, nvfp4_gemv, nvfp4_linear
from .reference import nvfp4_gemv_ref, nvfp4_linear_ref

# GEMV: every block term a*sfa*b*sfb/.. is exact in fp32 and blocks are summed in fp32 (relative error ~1e-7);
# the output is rounded once to fp16 (relative 2^-11 = 4.9e-4 per element), so 1e-3 norm-wise.
GEMV_TOL = 1e-3
# linear: decoded weights are exact in x's dtype, products exact in fp32, fp32 accumulation; the output is
# rounded to x's dtype (2^-11 fp16, 2^-8 bf16). Above 16 tokens W * global_scale is rounded to x's dtype once
# more before cuBLAS, doubling the rounding term.
LINEAR_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


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
    x = make_linear_inputs(1, 70, 96, torch.float16, device)
    w = torch.empty(70, 96, dtype=torch.float16, device=device)
    dequant_launch(x["packed"], x["scales"].view(torch.uint8), x["gs"].reshape(1), w)
    out.append(result("nvfp4_dequantize", "Triton kernel vs torch", w,
                      nvfp4_dequantize(x["packed"], x["scales"], x["gs"]), 2 ** -11))  # one fp16 rounding
    return out


# --- benchmarks -------------------------------------------------------------------------------

GEMV_SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4),           # GPU MODE benchmark shapes
               (4096, 4096, 1), (14336, 4096, 1), (4096, 14336, 1)]          # Llama-like decode (M, K)
# (N, K): Llama-3-8B's qkv, o, gate_up, down and Llama-3-70B's qkv, gate_up, down (the NVFP4 linear issue's set)
LINEAR_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (57344, 8192),
                 (8192, 28672)]
LINEAR_TOKENS = [1, 2, 4, 8, 16]  # decode
PREFILL_TOKENS = (17, 64, 128, 256, 512, 1024, 4096)
LINEAR_PREFILL = [((28672, 4096), PREFILL_TOKENS), ((4096, 14336), PREFILL_TOKENS)]


def gemv_bytes(M, K, L):
    """Least traffic: a and sfa once, row 0 of b and sfb, the fp16 output."""
    return M * (K // 2) * L + M * (K // 16) * L + (K // 2) * L + (K // 16) * L + 2 * M * L


def _lut_bf16(device):
    vals = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16, device=device)
    byte = torch.arange(256, device=device)
    return torch.stack([vals[byte & 15], vals[byte >> 4]], dim=-1)  # [256, 2]: (low, high) nibble values


def _dequant_bf16(packed, scales, lut):
    """torch-only dequantization: packed [L, R, K/2] uint8, scales [L, R, K/16] e4m3 -> bf16 [L, R, K]."""
    v = lut[packed.int()].flatten(-2)  # e2m1 * scale is exact in bf16
    return (v.unflatten(-1, (-1, 16)) * scales.to(torch.bfloat16)[..., None]).flatten(-2)


def _gemv_cases(quick):
    shapes = GEMV_SHAPES[:3] if quick else GEMV_SHAPES
    return [Case(shape={"M": M, "K": K, "L": L}, bytes=gemv_bytes(M, K, L), flops=2 * M * K * L, timing="graph",
                 write_bytes=2 * M * L,
                 make_inputs=lambda M=M, K=K, L=L: make_inputs(M, K, L, torch.device("cuda")))
            for M, K, L in shapes]


def _gemv_ours(x):
    return lambda: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"])


def _gemv_ours_static(x):  # model weights: the GEMV may start reading them while the previous call finishes
    return lambda: nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=True)


def _gemv_dequant_torch(x):
    lut = _lut_bf16(x["a"].device)
    a8, b8 = x["a"].view(torch.uint8).permute(2, 0, 1), x["b"].view(torch.uint8)[:1].permute(2, 0, 1)
    sa, sb = x["sfa"].permute(2, 0, 1), x["sfb"][:1].permute(2, 0, 1)

    def run():
        A = _dequant_bf16(a8, sa, lut)                  # [L, M, K]
        B = _dequant_bf16(b8, sb, lut).transpose(1, 2)  # [L, K, 1]
        return torch.bmm(A, B)
    return run


def _gemv_dense_bf16(x):
    lut = _lut_bf16(x["a"].device)
    A = _dequant_bf16(x["a"].view(torch.uint8).permute(2, 0, 1), x["sfa"].permute(2, 0, 1), lut)
    B = _dequant_bf16(x["b"].view(torch.uint8)[:1].permute(2, 0, 1), x["sfb"][:1].permute(2, 0, 1), lut)
    B = B.transpose(1, 2).contiguous()
    return lambda: torch.bmm(A, B)  # the same product on unquantized bf16 weights (3.6x the bytes)


def _scaled_mm_available():
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if cap < (10, 0):
        return f"torch._scaled_mm has no NVFP4 path below compute capability 10.0 (this GPU is sm_{cap[0]}{cap[1]})"
    return None


def _gemv_scaled_mm(x):
    a, b, sfa, sfb, c = x["a"], x["b"], x["sfa"], x["sfb"], x["c"]
    L = a.shape[2]
    sa = [to_blocked(sfa[:, :, i]) for i in range(L)]
    sb = [to_blocked(sfb[:, :, i]) for i in range(L)]

    def run():
        for i in range(L):
            c[:, 0, i] = torch._scaled_mm(a[:, :, i], b[:, :, i].transpose(0, 1), sa[i], sb[i],
                                          out_dtype=torch.float16)[:, 0]
    return run


def linear_bytes(T, N, K):
    return N * K // 2 + N * K // 16 + 2 * T * K + 2 * T * N + 4


def _linear_cases(quick):
    nkt = [(N, K, T) for N, K in LINEAR_SHAPES[1:2] for T in (1, 4, 16)] if quick else \
        [(N, K, T) for N, K in LINEAR_SHAPES for T in LINEAR_TOKENS] + \
        [(N, K, T) for (N, K), ts in LINEAR_PREFILL for T in ts]
    return [Case(shape={"T": T, "N": N, "K": K}, bytes=linear_bytes(T, N, K), flops=2 * T * N * K, timing="graph",
                 write_bytes=2 * T * N,
                 make_inputs=lambda T=T, N=N, K=K: make_linear_inputs(T, N, K, torch.bfloat16, torch.device("cuda"),
                                                                      bias=False))
            for N, K, T in nkt]


def _linear_module(x):
    """What a model runs: NVFP4Linear (the tiled layout where out_features % 16 == 0 and in_features % 256 == 0)."""
    N, KH = x["packed"].shape
    m = NVFP4Linear(2 * KH, N, bias=False, device=x["x"].device)
    m.set_weight(x["packed"], x["scales"])
    m.global_scale.copy_(x["gs"].reshape(1))
    return lambda: m(x["x"])


def _linear_ours(x):
    return lambda: nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"])


def _linear_dequant_torch(x):
    lut = _lut_bf16(x["x"].device)

    def run():
        w = _dequant_bf16(x["packed"][None], x["scales"][None], lut)[0] * x["gs"].to(torch.bfloat16)
        return torch.nn.functional.linear(x["x"], w)
    return run


def _linear_dense_bf16(x):
    w = nvfp4_dequantize(x["packed"], x["scales"], x["gs"], dtype=torch.bfloat16)
    return lambda: torch.nn.functional.linear(x["x"], w)


def _torchao_available():
    try:
        from torchao.quantization import Int4WeightOnlyConfig, quantize_  # noqa: F401
    except Exception as e:  # ImportError, or a torchao built for another torch
        return f"torchao is not usable here ({type(e).__name__}: {str(e)[:80]})"
    return None


def _linear_torchao_int4(x):
    """torchao's int4 weight-only linear (tinygemm, group 128: 4.1 bits per weight) on the same (dequantized) W."""
    from torchao.quantization import Int4WeightOnlyConfig, quantize_
    w = nvfp4_dequantize(x["packed"], x["scales"], x["gs"], dtype=torch.bfloat16)
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16, device=w.device)
    lin.weight.data.copy_(w)
    quantize_(lin, Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"))
    return lambda: lin(x["x"])


def benches():
    return [
        OpBench("nvfp4_gemv", _gemv_cases, [
            Impl("llmkernels", _gemv_ours),
            Impl("llmkernels-static-weights", _gemv_ours_static),
            Impl("torch-dequant-bf16-bmm", _gemv_dequant_torch),
            Impl("torch-bf16-dense", _gemv_dense_bf16),
            Impl("torch-scaled-mm", _gemv_scaled_mm, _scaled_mm_available),
        ]),
        OpBench("nvfp4_linear", _linear_cases, [
            Impl("llmkernels", _linear_module),
            Impl("llmkernels-plain-layout", _linear_ours),
            Impl("torch-dequant-bf16-linear", _linear_dequant_torch),
            Impl("torch-bf16-dense", _linear_dense_bf16),
            Impl("torchao-int4", _linear_torchao_int4, _torchao_available),
        ]),
    ]
