"""Benchmark cases and peers of sparse_mla_bwd for `llmkernels bench` (its checks: llmkernels.ops.sparse_mla)."""
import torch

from .. import Case, Impl, OpBench
from ...ops.sparse_mla.bwd import flops
from ...ops.sparse_mla.spec_bwd import make_inputs, reference_grads, run


S_Q, S_KV, TOPK, D_QK = 4096, 8192, 2048, 576
_cache = {}


def _inputs(h_q):
    if h_q not in _cache:  # one set per shape (building out/lse costs a chunked fp32 forward)
        _cache.clear()
        _cache[h_q] = make_inputs(S_Q, S_KV, h_q, TOPK, D_QK, torch.bfloat16, torch.device("cuda"))
    return _cache[h_q]


def _cases(quick):
    cases = []
    for h_q in (128, 64):
        least_bytes = 2 * (S_Q * h_q * (2 * D_QK + 3 * 512) + 2 * S_KV * D_QK) + 4 * S_Q * h_q + 4 * S_Q * TOPK
        cases.append(Case(shape={"s_q": S_Q, "s_kv": S_KV, "h_q": h_q, "topk": TOPK, "d_qk": D_QK},
                          make_inputs=lambda h_q=h_q: _inputs(h_q), bytes=least_bytes,
                          flops=flops(S_Q, h_q, TOPK, D_QK), bound="compute"))
    return cases


def benches():
    return [OpBench("sparse_mla_bwd", _cases, [
        Impl("llmkernels", lambda x: lambda: run(x)),
        Impl("llmkernels-deterministic", lambda x: lambda: run(x, deterministic=True)),
        Impl("torch-ref-autograd", lambda x: lambda: reference_grads(x)),  # fp32, by chunks of 256 rows
    ])]
