"""Checks of sparse_mla_bwd: inputs, tolerances, check(device); benchmarks in llmkernels.bench.specs.sparse_mla_bwd."""
import torch

from ...checking import CheckResult, result
from .autograd import sparse_mla_bwd
from .reference import sparse_mla_fwd_ref

# P and dS are rounded to the input dtype before their matrix products (as in every flash backward), and
# out/dout are given in that dtype: the norm-wise error is a few units of its rounding (bf16 2^-8,
# fp16 2^-11), measured ~4e-3 (bf16) and ~3e-4 (fp16); the sums themselves are fp32.
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def causal_indices(s_q, s_kv, topk, q_start, device, k_stride=1, generator=None):
    """Distinct random indices per row among the kv entries visible to it (row i sees t <= (q_start+i+1-k)//k),
    padded with -1 where a row sees fewer than topk entries: the shape of DeepSeek-V3.2's top-k selection."""
    rows = torch.arange(s_q, device=device) + q_start
    limit = torch.div(rows + 1 - k_stride, k_stride, rounding_mode="floor")
    score = torch.rand(s_q, s_kv, device=device, generator=generator)
    visible = torch.arange(s_kv, device=device)[None, :] <= limit[:, None]
    score = score.masked_fill(~visible, -1.0)
    val, idx = score.topk(min(topk, s_kv), dim=-1)
    idx = idx.masked_fill(val < 0, -1).to(torch.int32)
    if topk > s_kv:
        idx = torch.cat([idx, idx.new_full((s_q, topk - s_kv), -1)], dim=1)
    return idx


def make_inputs(s_q, s_kv, h_q, topk, d_qk, dtype, device, causal=True, sink=False, sm_scale=None, chunk=256,
                generator=None):
    """Forward inputs, the forward's out/lse (fp32 reference, computed by row chunks), and a random dout."""
    g = generator
    q_start = s_kv - s_q if causal else None
    x = {"q": torch.randn(s_q, h_q, d_qk, dtype=dtype, device=device, generator=g),
         "kv": torch.randn(s_kv, 1, d_qk, dtype=dtype, device=device, generator=g),
         "dout": torch.randn(s_q, h_q, 512, dtype=dtype, device=device, generator=g),
         "sm_scale": sm_scale if sm_scale is not None else 192 ** -0.5, "q_start": q_start,
         "attn_sink": torch.randn(h_q, device=device, generator=g) if sink else None}
    x["indices"] = (causal_indices(s_q, s_kv, topk, q_start, device, generator=g) if causal else
                    torch.randint(0, s_kv, (s_q, topk), dtype=torch.int32, device=device, generator=g))
    outs, lses = [], []
    with torch.no_grad():
        for r0 in range(0, s_q, chunk):
            o, _, lse = sparse_mla_fwd_ref(x["q"][r0:r0 + chunk], x["kv"], x["indices"][r0:r0 + chunk], x["sm_scale"],
                                           attn_sink=x["attn_sink"],
                                           q_start=None if q_start is None else q_start + r0)
            outs.append(o.to(dtype))
            lses.append(lse)
    x["out"], x["lse"] = torch.cat(outs), torch.cat(lses)
    return x


def reference_grads(x, chunk=256):
    """(dq, dkv, d_sink) by autograd through the fp32 reference, by row chunks (fits large shapes)."""
    kvf = x["kv"].float().requires_grad_()
    sink = x["attn_sink"].clone().requires_grad_() if x["attn_sink"] is not None else None
    dqs = []
    for r0 in range(0, x["q"].shape[0], chunk):
        qf = x["q"][r0:r0 + chunk].float().requires_grad_()
        o, _, _ = sparse_mla_fwd_ref(qf, kvf, x["indices"][r0:r0 + chunk], x["sm_scale"], attn_sink=sink,
                                     q_start=None if x["q_start"] is None else x["q_start"] + r0)
        o.backward(x["dout"][r0:r0 + chunk].float())
        dqs.append(qf.grad)
    return torch.cat(dqs), kvf.grad, (sink.grad if sink is not None else None)


def sink_err(got, ref, sink, lse, dout, out, dlse=None) -> float:
    """Error of d_sink[h] = -sum_i exp(sink_h - lse_ih) * (dO_ih . O_ih - dlse_ih), a sum of terms of both signs.

    The kernel's O is rounded (relative 2^-11 fp16, 2^-8 bf16), so its error is bounded by that rounding times
    sum_i exp(sink_h - lse_ih) |dO_ih| |O_ih|: measure against this size, not the (possibly cancelling) sum
    (a plain relative error fails at random when the few heads' sums happen to cancel). NaN -> inf.
    """
    if got.shape != ref.shape or torch.isnan(got).any():
        return float("inf")
    size = dout.float().norm(dim=-1) * out.float().norm(dim=-1) + (dlse.abs() if dlse is not None else 0)
    scale = (torch.exp(sink.detach()[None, :] - lse.detach()) * size).sum(0)
    return ((got - ref).abs() / scale.clamp_min(1e-30)).max().item()


def run(x, deterministic=False):
    return sparse_mla_bwd(x["q"], x["kv"], x["out"], x["dout"], x["indices"], x["lse"], x["sm_scale"],
                          attn_sink=x["attn_sink"], q_start=x["q_start"], deterministic=deterministic)


def check(device):
    res = []
    dtypes = [torch.float16] if device.type == "cpu" else [torch.bfloat16]  # interpreter bf16 dot is wrong
    shapes = ([(5, 40, 3, 37, 576, True), (4, 30, 2, 50, 512, False)] if device.type == "cpu" else
              [(96, 700, 128, 300, 576, True), (64, 500, 64, 257, 576, False), (50, 300, 16, 100, 512, True),
               # topk multiples of 16 with h_q > 32: the sm_90 Gluon second pass (the default path at scale)
               (80, 900, 128, 320, 576, True), (48, 600, 64, 256, 512, False)])
    for dtype in dtypes:
        for s_q, s_kv, h_q, topk, d_qk, sink in shapes:
            x = make_inputs(s_q, s_kv, h_q, topk, d_qk, dtype, device, causal=True, sink=sink)
            rq, rkv, rs = reference_grads(x)
            case = f"s_q={s_q} s_kv={s_kv} h_q={h_q} topk={topk} d_qk={d_qk} {str(dtype)[6:]}"
            for det in (False, True):
                g = run(x, det)
                tag = " det" if det else ""
                res.append(result("sparse_mla_bwd", case + tag + " dq", g[0], rq, TOL[dtype]))
                res.append(result("sparse_mla_bwd", case + tag + " dkv", g[1], rkv, TOL[dtype]))
                if sink:
                    err = sink_err(g[2], rs, x["attn_sink"], x["lse"], x["dout"], x["out"])
                    res.append(CheckResult("sparse_mla_bwd", case + tag + " d_sink", err <= TOL[dtype], err,
                                           TOL[dtype]))
    return res
