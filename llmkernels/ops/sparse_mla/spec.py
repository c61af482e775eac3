"""Checks and benchmark cases for sparse_mla_fwd and sparse_mla_attn_dist (CLI and scripts/gpu.sh)."""
import torch

from ...bench import Case, Impl, OpBench
from ...checking import generator, result
from .op import flash_mla_sparse_fwd, indexer_kl_loss, sparse_mla, sparse_mla_attn_dist
from .reference import indexer_kl_loss_ref, sparse_mla_attn_dist_ref, sparse_mla_fwd_ref

# out: P is rounded to the input dtype before P @ V and out is stored in it: a few units of its rounding
# (fp16 2^-11, bf16 2^-8) norm-wise. max_logits / lse / attn_dist: fp32 dot products of the exact inputs,
# so only fp32 summation order and exp2/log2 approximations differ (~1e-6 relative; 1e-4 leaves margin
# for logits of size ~10 whose absolute error feeds exp()).
OUT_TOL = {torch.float16: 3e-3, torch.bfloat16: 1.2e-2}
STAT_TOL = 1e-4


def causal_indices(s_q, s_kv, topk, q_start, device, k_stride=1, generator=None):
    """Random distinct indices per row among its visible kv positions, -1 where fewer are visible."""
    rows = torch.arange(s_q, device=device) + q_start
    limit = torch.div(rows + 1 - k_stride, k_stride, rounding_mode="floor")  # highest visible index
    out = torch.empty(s_q, topk, dtype=torch.int32, device=device)
    for r0 in range(0, s_q, 1024):  # [1024, s_kv] random keys at a time
        r1 = min(s_q, r0 + 1024)
        keys = torch.rand(r1 - r0, s_kv, device=device, generator=generator)
        keys.masked_fill_(torch.arange(s_kv, device=device)[None, :] > limit[r0:r1, None], -1.0)
        val, idx = keys.topk(min(topk, s_kv), dim=-1)
        idx = torch.where(val >= 0, idx, -1).to(torch.int32)
        out[r0:r1] = -1
        out[r0:r1, :idx.shape[1]] = idx
    return out


def make_inputs(s_q, s_kv, h_q, topk, d_qk, dtype, device, seed=None):
    g = generator(device, seed)
    q = torch.randn(s_q, h_q, d_qk, dtype=dtype, device=device, generator=g)
    kv = torch.randn(s_kv, 1, d_qk, dtype=dtype, device=device, generator=g)
    q_start = max(s_kv - s_q, 0)
    idx = causal_indices(s_q, s_kv, topk, q_start, device, generator=g)
    return {"q": q, "kv": kv, "indices": idx, "sm_scale": d_qk ** -0.5, "q_start": q_start}


def check(device):
    res = []
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float16  # the interpreter's bf16 dot is wrong
    cases = ([(67, 300, 128, 200, 576), (33, 150, 64, 130, 576), (20, 90, 16, 77, 512), (9, 40, 1, 64, 576)] if gpu
             else [(5, 60, 16, 37, 576), (4, 30, 3, 70, 512)])
    for s_q, s_kv, h_q, topk, d_qk in cases:
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, dtype, device)
        q, kv, idx, sc, qs = x["q"], x["kv"], x["indices"], x["sm_scale"], x["q_start"]
        idx[0] = -1  # a row with no valid index
        sink = torch.randn(h_q, device=device)
        tl = torch.randint(0, topk + 3, (s_q,), dtype=torch.int32, device=device)
        name = f"s_q={s_q} s_kv={s_kv} h_q={h_q} topk={topk} d_qk={d_qk}"
        o, m, l = sparse_mla(q, kv, idx, sc, attn_sink=sink, topk_length=tl, q_start=qs)
        ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, sc, attn_sink=sink, topk_length=tl, q_start=qs)
        res.append(result("sparse_mla_fwd", name + " out", o, ro, OUT_TOL[dtype]))
        res.append(result("sparse_mla_fwd", name + " max_logits", m, rm, STAT_TOL))
        res.append(result("sparse_mla_fwd", name + " lse", l, rl, STAT_TOL))
        d = sparse_mla_attn_dist(q, kv, idx, rl, sc, q_start=qs, topk_length=tl)
        rd = sparse_mla_attn_dist_ref(q, kv, idx, rl, sc, q_start=qs, topk_length=tl)
        res.append(result("sparse_mla_attn_dist", name, d, rd, STAT_TOL))
        logits = torch.randn(s_q, topk, device=device)
        kl = indexer_kl_loss(logits, q, kv, idx, rl, sc, q_start=qs, topk_length=tl)
        rkl = indexer_kl_loss_ref(logits, q, kv, idx, rl, sc, q_start=qs, topk_length=tl)
        res.append(result("indexer_kl_loss", name, kl, rkl, STAT_TOL))
        fo, fm, fl = flash_mla_sparse_fwd(q, kv, idx[:, None, :], sc, attn_sink=sink)
        ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, sc)  # FlashMLA: the sink only scales out, not lse
        ro = ro * torch.sigmoid(rl - sink[None, :]).nan_to_num(1.0)[..., None]
        res.append(result("flash_mla_sparse_fwd", name + " out", fo, ro, OUT_TOL[dtype]))
        res.append(result("flash_mla_sparse_fwd", name + " lse", fl, rl, STAT_TOL))
    return res


# --- benchmarks -------------------------------------------------------------------------------

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
