"""Benchmark cases and peers of sparse_mla for `llmkernels bench` (its checks: llmkernels.ops.sparse_mla)."""
import torch

from .. import Case, Impl, OpBench
from ...ops.sparse_mla.op import sparse_mla, sparse_mla_attn_dist
from ...ops.sparse_mla.reference import sparse_mla_attn_dist_ref, sparse_mla_fwd_ref
from ...ops.sparse_mla.spec import make_inputs


S_Q, S_KV, TOPK = 4096, 8192, 2048


def _shapes(quick):
    main = [(S_Q, S_KV, 128, TOPK, 576), (S_Q, S_KV, 64, TOPK, 576)]
    return main if quick else main + [(S_Q, S_KV, 16, TOPK, 576), (S_Q, S_KV, 128, TOPK, 512),
                                       (S_Q, S_KV, 128, 512, 576)]


def _case(shape, fwd):
    s_q, s_kv, h_q, topk, d_qk = shape
    flops = 2 * s_q * topk * h_q * (d_qk + 512) if fwd else 2 * s_q * h_q * d_qk * topk
    mk = lambda: _with_lse(make_inputs(*shape, torch.bfloat16, torch.device("cuda")), fwd)  # noqa: E731
    nbytes = 2 * (s_q * h_q * d_qk + s_kv * d_qk) + 4 * s_q * topk + (2 * s_q * h_q * 512 if fwd else 4 * s_q * topk)
    return Case(shape=dict(s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, d_qk=d_qk), make_inputs=mk, bytes=nbytes,
                flops=flops, bound="compute")


def _with_lse(x, fwd):
    if not fwd:  # attn_dist takes the forward's lse
        x["lse"] = sparse_mla(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])[2]
    return x


def _chunked(fn, x, rows=256):
    """The fp32 reference over blocks of query rows (whole-tensor fp32 gathers would not fit)."""
    def run():
        q, idx = x["q"], x["indices"]
        for r0 in range(0, q.shape[0], rows):
            r1 = min(r0 + rows, q.shape[0])
            fn(q[r0:r1], idx[r0:r1], x["q_start"] + r0, r0, r1)
    return run


def _fwd_ours(x):
    return lambda: sparse_mla(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])


def _fwd_ref(x):
    return _chunked(lambda q, idx, qs, r0, r1: sparse_mla_fwd_ref(q, x["kv"], idx, x["sm_scale"], q_start=qs), x)


def _dist_ours(x):
    return lambda: sparse_mla_attn_dist(x["q"], x["kv"], x["indices"], x["lse"], x["sm_scale"], q_start=x["q_start"])


def _dist_ref(x):
    return _chunked(lambda q, idx, qs, r0, r1: sparse_mla_attn_dist_ref(q, x["kv"], idx, x["lse"][r0:r1],
                                                                          x["sm_scale"], q_start=qs), x)


def _flash_mla_available():
    try:
        import flash_mla  # noqa: F401
    except ImportError as e:
        return f"flash_mla is not installed ({e})"
    return None


def _flash_mla(x):
    from flash_mla import flash_mla_sparse_fwd as fm
    # FlashMLA has no causal option: causality is already in the indices (-1 beyond the visible range). On Hopper
    # the sgl-flash-mla wheel runs its sm_90 kernel only with use_legacy=True (h_q 64 / 128).
    legacy = torch.cuda.get_device_capability(x["q"].device)[0] == 9
    return lambda: fm(x["q"], x["kv"], x["indices"][:, None, :], x["sm_scale"], use_legacy=legacy)


def benches():
    return [
        OpBench("sparse_mla_fwd", lambda quick: [_case(s, True) for s in _shapes(quick)], [
            Impl("llmkernels", _fwd_ours),
            Impl("torch-ref-fp32", _fwd_ref),
            Impl("flash_mla", _flash_mla, _flash_mla_available),
        ]),
        OpBench("sparse_mla_attn_dist", lambda quick: [_case(s, False) for s in _shapes(quick)], [
            Impl("llmkernels", _dist_ours),
            Impl("torch-ref-fp32", _dist_ref),
        ]),
    ]
