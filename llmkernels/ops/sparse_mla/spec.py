"""Checks of sparse_mla_fwd / attn_dist: inputs, tolerances, check(device) (benchmarks: bench.specs.sparse_mla)."""
import torch

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
