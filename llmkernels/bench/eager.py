"""Eager calls: wall time per call of back-to-back calls from plain PyTorch (no CUDA graph), ours beside the peers'.

What a user pays outside a graph (Hugging Face generate, notebooks, training loops): validation, dispatch,
allocations and launches on the host, or the GPU time where that is longer. Small shapes, so the host shows.
Records: impl "llmkernels-eager" / "<peer>-eager", timing "eager", ms = wall time per call.
"""
import torch

from .harness import Case, Impl, OpBench

CALLS = 300  # back-to-back calls per timed round (harness._eager_ms takes the median of rounds)


def _case(shape, make, nbytes=0):
    return Case(shape=shape, make_inputs=make, bytes=nbytes, timing="eager")


def _fi_available():
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return "flashinfer is not installed (pip install 'llmkernels[peers]')"
    return None


def _masked_decode():
    from ..ops.masked_decode import spec
    from ..ops.masked_decode.op import masked_decode
    B, Hkv, Hq, L, D = 4, 8, 32, 4096, 128

    def make(mask):
        x = spec.make_inputs(B, Hkv, Hq, L, D, torch.bfloat16, torch.device("cuda"), kept=0.5)
        x["mask"] = mask
        x["lens"] = torch.full((B,), L - 7, dtype=torch.int32, device="cuda")
        return x

    def ours(x):
        if x["mask"]:
            return lambda: masked_decode(x["q"], x["k"], x["v"], x["drop"], kv_len=x["lens"])
        return lambda: masked_decode(x["q"], x["k"], x["v"])

    def sdpa(x):
        import torch.nn.functional as F
        q = x["q"][:, :, None, :]
        if not x["mask"]:
            return lambda: F.scaled_dot_product_attention(q, x["k"], x["v"], enable_gqa=True)
        keep = (~x["drop"]).repeat_interleave(Hq // Hkv, dim=1)[:, :, None, :]
        return lambda: F.scaled_dot_product_attention(q, x["k"], x["v"], attn_mask=keep, enable_gqa=True)

    def flashinfer(x):
        from .specs.masked_decode import _flashinfer_decode, _flashinfer_sparse
        return _flashinfer_sparse(x) if x["mask"] else _flashinfer_decode(x)

    cases = lambda quick: [_case({"B": B, "Hkv": Hkv, "Hq": Hq, "L": L, "D": D, "mask": m},  # noqa: E731
                                 lambda m=m: make(m)) for m in (False, True)]
    return OpBench("masked_decode", cases, [Impl("llmkernels-eager", ours), Impl("sdpa-eager", sdpa),
                                            Impl("flashinfer-eager", flashinfer, _fi_available)])


def _merge():
    from ..ops.combine.op import merge_attention_states
    R, D = 128, 128

    def make():
        return {"o": [torch.randn(R, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)],
                "l": [torch.randn(R, device="cuda") for _ in range(2)]}

    def flashinfer(x):
        import flashinfer
        (oa, ob), (la, lb) = x["o"], x["l"]
        return lambda: flashinfer.merge_state(oa[:, None], la[:, None], ob[:, None], lb[:, None])

    return OpBench("merge_attention_states", lambda quick: [_case({"parts": 2, "rows": R, "D": D}, make)],
                   [Impl("llmkernels-eager", lambda x: lambda: merge_attention_states(x["o"], x["l"])),
                    Impl("flashinfer-eager", flashinfer, _fi_available)])


def _xl():
    from ..ops.xl_paged_decode import spec
    S, H, D, BS, L = 4, 16, 128, 16, 1024

    def make():
        return spec.make_inputs(S, H, H, D, BS, L, "nhd", torch.bfloat16, "cuda", u="head", bd="contig")

    return OpBench("xl_paged_decode", lambda quick: [_case({"num_seqs": S, "context": L, "H": H, "D": D}, make)],
                   [Impl("llmkernels-eager", lambda x: lambda: spec.run(x))])


def _inkling():
    from ..ops.inkling_decode import spec
    from .peers import flex_available
    from .specs.inkling_decode import _flex
    B, Hq, Hkv, D, L, E = 4, 16, 2, 128, 1024, 512

    def make():
        return spec.make_inputs(B, Hq, Hkv, D, L, E, "dense", torch.bfloat16, "cuda", window=256, L=L)

    return OpBench("inkling_decode", lambda quick: [_case({"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "L": L,
                                                           "rel_extent": E, "window": 256}, make)],
                   [Impl("llmkernels-eager", lambda x: lambda: spec.run(x, scale=1 / D)),
                    Impl("flex-attention-eager", _flex, flex_available)])


def _sparse_mla():
    from ..ops.sparse_mla import spec
    from ..ops.sparse_mla.autograd import sparse_mla_bwd
    from ..ops.sparse_mla.op import sparse_mla, sparse_mla_attn_dist
    s_q, s_kv, h_q, topk = 64, 4096, 64, 256
    shape = {"s_q": s_q, "s_kv": s_kv, "h_q": h_q, "topk": topk, "d_qk": 576}

    def make():
        x = spec.make_inputs(s_q, s_kv, h_q, topk, 576, torch.bfloat16, torch.device("cuda"))
        x["out"], _, x["lse"] = sparse_mla(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        x["dout"] = torch.randn_like(x["out"])
        return x

    def fwd(x):
        return lambda: sparse_mla(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])

    def dist(x):
        return lambda: sparse_mla_attn_dist(x["q"], x["kv"], x["indices"], x["lse"], x["sm_scale"],
                                            q_start=x["q_start"])

    def bwd(x):
        return lambda: sparse_mla_bwd(x["q"], x["kv"], x["out"], x["dout"], x["indices"], x["lse"], x["sm_scale"],
                                      q_start=x["q_start"])

    cases = lambda quick: [_case(shape, make)]  # noqa: E731
    from .specs.sparse_mla import _flash_mla, _flash_mla_available  # the peer, as the GPU-time bench runs it
    return [OpBench("sparse_mla_fwd", cases, [Impl("llmkernels-eager", fwd),
                                              Impl("flash_mla-eager", _flash_mla, _flash_mla_available)]),
            OpBench("sparse_mla_attn_dist", cases, [Impl("llmkernels-eager", dist)]),
            OpBench("sparse_mla_bwd", cases, [Impl("llmkernels-eager", bwd)])]


def _nvfp4():
    from ..ops.nvfp4 import spec
    from ..ops.nvfp4.op import NVFP4Linear, custom_kernel, nvfp4_linear
    N, K = 4096, 4096

    def make(T, api):
        x = spec.make_linear_inputs(T, N, K, torch.bfloat16, torch.device("cuda"), bias=False)
        x["api"] = api
        return x

    def ours(x):
        if x["api"] == "function":
            return lambda: nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"])
        m = NVFP4Linear(K, N, bias=False, device="cuda")
        m.set_weight(x["packed"], x["scales"])
        m.global_scale.copy_(x["gs"].reshape(1))
        return lambda: m(x["x"])

    def linear(x):
        lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        return lambda: lin(x["x"])

    from .specs.nvfp4_gemv import GEMV_SHAPES
    M, KG, L = GEMV_SHAPES[0]

    def gemv(x):
        data = (x["a"], x["b"], x["sfa"], x["sfb"], None, None, x["c"])
        return lambda: custom_kernel(data)

    calls = [(1, "module"), (1, "function"), (300, "module")]  # 300 tokens: the prefill path (sm_90: wgmma)

    def cases(quick):
        return [_case({"T": T, "N": N, "K": K, "api": a}, lambda T=T, a=a: make(T, a)) for T, a in calls]

    return [OpBench("nvfp4_linear", cases,
                    [Impl("llmkernels-eager", ours), Impl("torch-linear-bf16-eager", linear)]),
            OpBench("nvfp4_gemv", lambda quick: [_case({"M": M, "K": KG, "L": L, "api": "custom_kernel"},
                                                       lambda: spec.make_inputs(M, KG, L, torch.device("cuda")))],
                    [Impl("llmkernels-eager", gemv)])]


def _moe():
    """A MoE layer's decode-time pieces at the Qwen3-30B-A3B shape, one token: the router's choice (moe_topk against
    transformers' softmax + topk + renormalisation in torch's ops) and the routed experts (nvfp4_moe against
    transformers' bf16 grouped_mm experts module)."""
    from ..ops.moe_topk.op import moe_topk
    from ..ops.moe_topk.reference import moe_topk_ref
    from ..ops.nvfp4.spec import make_moe_inputs, moe_routing
    from .specs.nvfp4_moe import MOE_SHAPES, _ours, _transformers_available, _transformers_bf16
    E, H, I, k = MOE_SHAPES["qwen3-30b-a3b"]
    router = _case({"router": "qwen3-moe", "T": 1, "E": E, "k": k},
                   lambda: {"x": torch.randn(1, E, device="cuda").to(torch.bfloat16)})

    def experts():
        idx = moe_routing(1, E, k, torch.device("cpu"), seed=1).cuda()
        return make_moe_inputs(1, E, H, I, k, torch.bfloat16, torch.device("cuda"), idx=idx)

    return [OpBench("moe_topk", lambda quick: [router],
                    [Impl("llmkernels-eager", lambda x: lambda: moe_topk(x["x"], k)),
                     Impl("torch-ops-eager", lambda x: lambda: moe_topk_ref(x["x"], k))]),
            OpBench("nvfp4_moe", lambda quick: [_case({"model": "qwen3-30b-a3b", "T": 1, "E": E, "H": H, "I": I,
                                                       "k": k}, experts)],
                    [Impl("llmkernels-eager", _ours),
                     Impl("transformers-bf16-grouped-mm-eager", _transformers_bf16, _transformers_available)])]


def benches(ops=None):
    """The eager benches of the given registry op names (all when None)."""
    out = [_masked_decode(), _merge(), _xl(), _inkling(), *_sparse_mla(), *_nvfp4(), *_moe()]
    if ops is not None:
        wanted = set(ops) | ({"merge_attention_states"} if "masked_decode" in ops else set())
        out = [b for b in out if b.op in wanted]
    return out
