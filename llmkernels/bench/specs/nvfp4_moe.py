"""Benchmark cases and peers of nvfp4_moe for `llmkernels bench` (its checks: llmkernels.ops.nvfp4.spec): a decode
step's routed experts of one layer at the Qwen3-MoE shapes. The floor reads each expert the step's tokens chose once
(distinct among them: the routing is fixed per case, so every implementation gets the same), x and the routing, and
writes y."""
import torch

from .. import Case, Impl, OpBench
from ...ops.nvfp4.moe import _flat, _moe, nvfp4_moe
from ...ops.nvfp4.spec import make_moe_inputs, moe_routing

# name -> (experts, hidden, expert intermediate, active per token)
MOE_SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "qwen3-235b-a22b": (128, 4096, 1536, 8)}
MOE_TOKENS = (1, 4, 16, 32, 64, 128, 256, 1024)  # decode sizes; mid-size batches (where mma pairs and grouped cross); a
# prefill chunk


def expert_bytes(H: int, I: int) -> int:
    """One NVFP4 expert: gate, up and down codes (1/2 byte a weight), e4m3 scales (1/16) and 3 global scales."""
    return 3 * H * I // 2 + 3 * H * I // 16 + 12


def moe_bytes(idx: torch.Tensor, E: int, H: int, I: int) -> int:
    T, k = idx.shape
    active = int(torch.unique(idx[(idx >= 0) & (idx < E)]).numel())
    return active * expert_bytes(H, I) + 2 * T * H + T * k * (4 + 2) + 2 * T * H


def _cases(quick):
    out = []
    for model, (E, H, I, k) in list(MOE_SHAPES.items())[:1 if quick else None]:
        for T in MOE_TOKENS:
            idx = moe_routing(T, E, k, torch.device("cpu"), seed=T).cuda()
            out.append(Case(shape={"model": model, "T": T, "E": E, "H": H, "I": I, "k": k},
                            bytes=moe_bytes(idx, E, H, I), flops=6 * T * k * H * I, timing="graph",
                            write_bytes=2 * T * H,
                            make_inputs=lambda T=T, E=E, H=H, I=I, k=k, idx=idx: make_moe_inputs(
                                T, E, H, I, k, torch.bfloat16, torch.device("cuda"), idx=idx)))
    return out


def _ours(x):
    return lambda: nvfp4_moe(x["x"], x["idx"], x["w"], x["gate"], x["up"], x["down"])


def _variant(**path):  # _moe forced onto one path: the plain-Triton pair, the mma pair or the grouped kernels
    def build(x):
        flat = _flat(x["gate"], x["up"], x["down"])
        return lambda: _moe(x["x"], x["idx"], x["w"], *flat, **path)
    return build


def _transformers_available():
    try:
        from transformers import Qwen3MoeConfig  # noqa: F401
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: F401
    except Exception as e:
        return f"transformers' Qwen3-MoE experts are not importable here ({type(e).__name__}: {str(e)[:80]})"
    return None


def _transformers_bf16(x):
    """transformers' own experts module (Qwen3MoeExperts, fused [E, 2I, H] / [E, H, I] bf16 weights) on its
    grouped_mm implementation, the default and CUDA-graph safe: what the model runs in bf16."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    E, I, H = x["gate"][0].shape[0], x["gate"][0].shape[1], x["x"].shape[1]
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, hidden_act="silu")
    cfg._experts_implementation = "grouped_mm"
    with torch.device(x["x"].device):
        m = Qwen3MoeExperts(cfg).to(torch.bfloat16)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, 0.02)
        m.down_proj.normal_(0, 0.02)
    idx = x["idx"].long()
    return lambda: m(x["x"], idx, x["w"])


def benches():
    return [OpBench("nvfp4_moe", _cases, [
        Impl("llmkernels", _ours),
        Impl("llmkernels-plain-triton", _variant(mma=False, grouped=False)),
        Impl("llmkernels-mma", _variant(mma=True, grouped=False)),  # one program group a pair, any T
        Impl("llmkernels-grouped", _variant(grouped=True, tiles=False)),  # sorted by expert, tl.dot tiles, any T
        Impl("llmkernels-mma-tiles", _variant(grouped=True, mma=True, tiles=8)),  # 8 pairs of an expert an mma
        Impl("llmkernels-mma-tiles16", _variant(grouped=True, mma=True, tiles=16)),  # 16: its two token groups
        Impl("transformers-bf16-grouped-mm", _transformers_bf16, _transformers_available),
    ])]
