"""Benchmark cases and peers of nvfp4_gemv for `llmkernels bench` (its checks: llmkernels.ops.nvfp4)."""
import torch

from .. import Case, Impl, OpBench
from ...ops.nvfp4.format import E2M1_VALUES, nvfp4_dequantize, to_blocked
from ...ops.nvfp4.op import NVFP4Linear, nvfp4_gemv, nvfp4_linear
from ...ops.nvfp4.spec import make_inputs, make_linear_inputs


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
