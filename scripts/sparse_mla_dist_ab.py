"""Same-run A/B of the sm_90 attn_dist against a previous version copied to llmkernels/ops/_sm_head (see
scripts/sparse_mla_ab.py for the copy), interleaved A B A B so that drift hits both. Record shape, h_q 128 and 64.
Usage (repo root, PYTHONPATH=.): python scripts/sparse_mla_dist_ab.py"""
import importlib

import torch
import triton

from llmkernels.ops.sparse_mla import attn_dist_wgmma as WD
from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

HD = importlib.import_module("llmkernels.ops._sm_head.attn_dist_wgmma")
dev = torch.device("cuda")
S_Q, S_KV, TOPK, D_QK = 4096, 8192, 2048, 576


def dist(mod, a, lse, cfg=None):
    out = torch.zeros(a.indices.shape, device=dev)
    mod.attn_dist_ws_launch(a, lse, out, config=cfg)
    return out


for h_q in (64, 128):
    x = make_inputs(S_Q, S_KV, h_q, TOPK, D_QK, torch.bfloat16, dev, seed=1)
    a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
    o = (torch.empty((S_Q, h_q, 512), dtype=a.q.dtype, device=dev), torch.empty((S_Q, h_q), device=dev),
         torch.empty((S_Q, h_q), device=dev))
    WF.sparse_mla_fwd_ws_launch(a, *o)
    lse = o[2]
    flop = 2 * S_Q * h_q * D_QK * TOPK
    print(f"h_q={h_q} bitwise new == head: {torch.equal(dist(WD, a, lse), dist(HD, a, lse))}", flush=True)
    variants = [("new", lambda: dist(WD, a, lse)), ("head", lambda: dist(HD, a, lse)),
                ("new GRID=rows", lambda: dist(WD, a, lse, dict(GRID=1 << 30))),
                ("head gather-only", lambda: dist(HD, a, lse, dict(GATHER_ONLY=True))),
                ("new gather-only", lambda: dist(WD, a, lse, dict(GATHER_ONLY=True)))]
    for rep in range(2):
        for name, fn in variants:
            fn()
            ms = triton.testing.do_bench(fn, warmup=30, rep=200)
            print(f"h_q={h_q:>3} rep {rep} {name:<18} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s "
                  f"gather {S_Q * TOPK * D_QK * 2 / ms / 1e9:5.2f} TB/s", flush=True)
