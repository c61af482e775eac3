"""On the GPU: the Gluon attn_dist kernel against the fp32 reference and the Triton kernel, then timings at the
record shapes (and the gather-only variant = the L2 gather ceiling). Usage: python scripts/sparse_mla_dist_device.py"""
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llmkernels.ops.sparse_mla import attn_dist as T  # noqa: E402
from llmkernels.ops.sparse_mla import attn_dist_wgmma as W  # noqa: E402
from llmkernels.ops.sparse_mla.common import prepare  # noqa: E402
from llmkernels.ops.sparse_mla.op import sparse_mla  # noqa: E402
from llmkernels.ops.sparse_mla.reference import sparse_mla_attn_dist_ref, sparse_mla_fwd_ref  # noqa: E402
from llmkernels.ops.sparse_mla.spec import make_inputs  # noqa: E402

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")
SHAPES = [(128, 2048, 576), (64, 2048, 576), (16, 2048, 576), (128, 2048, 512), (128, 512, 576)]
WS_CFGS = [None, dict(STAGES=2), dict(BLOCK_N=32, STAGES=6), dict(BLOCK_N=32, STAGES=4)]  # None: the shipped one
if os.environ.get("ROUND") == "6":
    SHAPES = SHAPES[:2]


def gluon_ws(a, lse, cfg=None):
    out = torch.zeros(a.indices.shape, dtype=torch.float32, device=dev)
    W.attn_dist_ws_launch(a, lse, out, config=cfg)
    return out


def triton_path(a, lse):
    out = torch.zeros(a.indices.shape, dtype=torch.float32, device=dev)
    T.attn_dist_launch(a, lse, out, config=T.dist_config(a.q.shape[1], a.indices.shape[1], dev))
    return out


def correctness():
    fails = 0
    g = torch.Generator(device=dev).manual_seed(0)
    cases = [  # s_q, s_kv, h_q, topk, d_qk, kind
        (67, 300, 128, 200, 576, "causal"), (33, 150, 64, 130, 576, "causal"), (20, 90, 16, 77, 512, "causal"),
        (9, 40, 1, 64, 576, "causal"), (17, 1000, 200, 333, 576, "causal"), (40, 500, 96, 100, 576, "garbage"),
        (30, 64, 128, 257, 576, "stride4"), (25, 700, 128, 300, 512, "tlen"), (23, 300, 128, 100, 576, "noncontig"),
        (12, 5000, 128, 2048, 576, "causal"), (5, 20, 128, 64, 576, "dup"),
    ]
    for s_q, s_kv, h_q, topk, d_qk, kind in cases:
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=s_q * 7 + h_q)
        q, kv, idx, sc, qs = x["q"], x["kv"], x["indices"], x["sm_scale"], x["q_start"]
        kw = dict(q_start=qs)
        if kind == "garbage":  # invalid values over the whole int32 range, mixed with valid ones
            junk = torch.randint(-2**31, 2**31 - 1, idx.shape, device=dev, dtype=torch.int64).to(torch.int32)
            junk[:, :4] = torch.tensor([-1, s_kv, 2**31 - 1, -2**31], dtype=torch.int32, device=dev)
            idx = torch.where(torch.rand(idx.shape, device=dev) < 0.5, idx, junk)
            kw = {}
        elif kind == "stride4":
            from llmkernels.ops.sparse_mla.spec import causal_indices
            kw = dict(q_start=torch.tensor([100], dtype=torch.int32, device=dev), k_stride=4)
            idx = causal_indices(s_q, s_kv, topk, 100, dev, k_stride=4)
        elif kind == "tlen":
            kw["topk_length"] = torch.randint(0, topk + 3, (s_q,), dtype=torch.int32, device=dev)
        elif kind == "noncontig":
            q = torch.randn(s_q, h_q * 2, d_qk + 64, dtype=torch.bfloat16, device=dev)[:, ::2, :d_qk]
            kv = torch.randn(s_kv, 1, d_qk + 64, dtype=torch.bfloat16, device=dev)[:, :, :d_qk]
        elif kind == "dup":
            idx = torch.randint(0, 4, idx.shape, dtype=torch.int32, device=dev)
            kw = {}
        idx[0] = -1  # a row with no valid index
        _, _, lse = sparse_mla_fwd_ref(q, kv, idx, sc, topk_length=kw.get("topk_length"),
                                       q_start=kw.get("q_start"), k_stride=kw.get("k_stride", 1))
        ref = sparse_mla_attn_dist_ref(q, kv, idx, lse, sc, q_start=kw.get("q_start"),
                                       k_stride=kw.get("k_stride", 1), topk_length=kw.get("topk_length"))
        a = prepare(q, kv, idx, sc, topk_length=kw.get("topk_length"), q_start=kw.get("q_start"),
                    k_stride=kw.get("k_stride", 1))
        for c in WS_CFGS + ["triton"]:
            out = triton_path(a, lse) if c == "triton" else gluon_ws(a, lse, c)
            # probabilities summed over heads: fp32 logits of exact inputs, only summation order and exp2
            # differ, so 1e-4 of the row scale (values are <= h_q) is generous; NaN fails
            err = ((out - ref).abs() / (1 + ref.abs())).max().item()
            nan = bool(torch.isnan(out).any())
            ok = err < 1e-4 and not nan
            fails += not ok
            print(f"{'ok ' if ok else 'FAIL'} {kind:<9} s_q={s_q} s_kv={s_kv} h_q={h_q} topk={topk} d_qk={d_qk} "
                  f"cfg={c} err={err:.2e}{' NaN' if nan else ''}", flush=True)
    return fails


def timings():
    rows = []
    for h_q, topk, d_qk in SHAPES:
        s_q, s_kv = 4096, 8192
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=1)
        q, kv, idx, sc, qs = x["q"], x["kv"], x["indices"], x["sm_scale"], x["q_start"]
        _, _, lse = sparse_mla(q, kv, idx, sc, q_start=qs)
        a = prepare(q, kv, idx, sc, q_start=qs)
        flop = 2 * s_q * h_q * d_qk * topk
        gbytes = s_q * topk * d_qk * 2
        ref = triton_path(a, lse)
        variants = [("triton", lambda: triton_path(a, lse), None)]
        for c in WS_CFGS:
            variants.append((f"ws {c or 'default'}", (lambda c=c: gluon_ws(a, lse, c)), c))
        variants.append(("gather-only", lambda: gluon_ws(a, lse, dict(GATHER_ONLY=True)), None))
        for name, fn, c in variants:
            try:
                out = fn()
                err = ((out - ref).abs() / (1 + ref.abs())).max().item() if "gather" not in name else 0.0
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
            except Exception as e:  # a config that does not fit (registers / shared memory) is reported, not fatal
                print(f"h_q={h_q} topk={topk} d_qk={d_qk} {name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            r = dict(h_q=h_q, topk=topk, d_qk=d_qk, impl=name, ms=ms, tflops=flop / ms / 1e9,
                     gather_tbs=gbytes / ms / 1e9, err=err)
            rows.append(r)
            print(f"h_q={h_q:>3} topk={topk} d_qk={d_qk} {name:<58} {ms:7.3f} ms {r['tflops']:6.1f} TFLOP/s "
                  f"gather {r['gather_tbs']:5.2f} TB/s err {err:.1e}", flush=True)
    json.dump(rows, open(f"{OUT}/dist_gluon.json", "w"), indent=1)


def memcheck():
    """A small case with garbage indices, for compute-sanitizer --tool memcheck."""
    s_q, s_kv, h_q, topk = 8, 100, 128, 96
    x = make_inputs(s_q, s_kv, h_q, topk, 576, torch.bfloat16, dev, seed=3)
    idx = torch.randint(-2**31, 2**31 - 1, (s_q, topk), device=dev, dtype=torch.int64).to(torch.int32)
    idx[:, :4] = torch.tensor([-1, s_kv, 2**31 - 1, -2**31], dtype=torch.int32, device=dev)
    idx[:, 4:40] = torch.randint(0, s_kv, (s_q, 36), dtype=torch.int32, device=dev)
    lse = torch.randn(s_q, h_q, device=dev) + 30
    for h in (128, 64, 200):
        a = prepare(x["q"][:, :h] if h <= 128 else torch.randn(s_q, h, 576, dtype=torch.bfloat16, device=dev),
                    x["kv"], idx, 0.04)
        gluon_ws(a, torch.randn(s_q, h, device=dev) + 30)
    torch.cuda.synchronize()
    print("memcheck case ran")


if __name__ == "__main__" and "--memcheck" in sys.argv:
    memcheck()
elif __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    f = correctness()
    print(f"correctness failures: {f}")
    timings()
