"""attn_dist (sm_90) at the record shape: why the gather-only probe is slower where the consumers take alternate
tiles (h_q <= 64) than where both read every tile (h_q 128). Times the kernel and its GATHER_ONLY probe with the
alternate-tile protocol and with SPLIT forced (consumer 1 then takes 64 padded heads: same bytes gathered).
Results (2026-11-23, H100): benchmarks/notes/sparse_mla_dist_probe_runs.txt (also ALL_WAIT, a variant where both
consumers wait for every tile, since removed: commit 3c19537). Usage (repo root, PYTHONPATH=.): python scripts/sparse_mla_dist_probe.py"""
import torch
import triton

from llmkernels.ops.sparse_mla import attn_dist_wgmma as WD
from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

dev = torch.device("cuda")
S_Q, S_KV, TOPK, D_QK = 4096, 8192, 2048, 576


def dist(a, lse, cfg):
    out = torch.zeros(a.indices.shape, device=dev)
    WD.attn_dist_ws_launch(a, lse, out, config=cfg)
    return out


for h_q in (64, 128):
    x = make_inputs(S_Q, S_KV, h_q, TOPK, D_QK, torch.bfloat16, dev, seed=1)
    a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
    o = (torch.empty((S_Q, h_q, 512), dtype=a.q.dtype, device=dev), torch.empty((S_Q, h_q), device=dev),
         torch.empty((S_Q, h_q), device=dev))
    WF.sparse_mla_fwd_ws_launch(a, *o)
    lse = o[2]
    ref = dist(a, lse, None)
    flop = 2 * S_Q * h_q * D_QK * TOPK
    variants = [None, dict(STAGES=3), dict(GATHER_ONLY=True), dict(GATHER_ONLY=True, STAGES=3)]
    if h_q <= 64:
        variants += [dict(SPLIT=True), dict(SPLIT=True, GATHER_ONLY=True), dict(SPLIT=True, GATHER_ONLY=True, STAGES=3)]
    for cfg in variants:
        fn = lambda cfg=cfg: dist(a, lse, cfg)  # noqa: E731
        got = fn()
        same = "" if cfg and cfg.get("GATHER_ONLY") else f" bitwise={torch.equal(got, ref)}"
        ms = triton.testing.do_bench(fn, warmup=30, rep=200)
        print(f"h_q={h_q:>3} {str(cfg):<52} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s "
              f"gather {S_Q * TOPK * D_QK * 2 / ms / 1e9:5.2f} TB/s{same}", flush=True)
