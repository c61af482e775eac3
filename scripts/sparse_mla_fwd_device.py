"""On the GPU: the Gluon sparse MLA forward against the fp32 reference and the Triton kernel, then timings at the
record shapes. Usage: python scripts/sparse_mla_fwd_device.py [--memcheck]"""
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llmkernels.checking import rel_err  # noqa: E402
from llmkernels.ops.sparse_mla import fwd as T  # noqa: E402
from llmkernels.ops.sparse_mla import fwd_wgmma as F  # noqa: E402
from llmkernels.ops.sparse_mla.common import prepare  # noqa: E402
from llmkernels.ops.sparse_mla.reference import sparse_mla_fwd_ref  # noqa: E402
from llmkernels.ops.sparse_mla.spec import OUT_TOL, STAT_TOL, causal_indices, make_inputs  # noqa: E402

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")
CFGS = [None, dict(STAGES=2)]


def outputs(a):
    s_q, h_q = a.q.shape[:2]
    return (torch.full((s_q, h_q, 512), float("nan"), dtype=a.q.dtype, device=dev),
            torch.full((s_q, h_q), float("nan"), device=dev), torch.full((s_q, h_q), float("nan"), device=dev))


def ws(a, cfg=None):
    o = outputs(a)
    F.sparse_mla_fwd_ws_launch(a, *o, config=cfg)
    return o


def tri(a):
    o = outputs(a)
    T.sparse_mla_fwd_launch(a, *o, config=T.fwd_config(a.q.shape[1], a.indices.shape[1], dev))
    return o


def correctness():
    fails = 0
    cases = [  # s_q, s_kv, h_q, topk, d_qk, kind
        (67, 300, 128, 200, 576, "causal"), (33, 150, 64, 130, 576, "sink"), (20, 90, 16, 77, 512, "causal"),
        (9, 40, 1, 64, 576, "causal"), (17, 1000, 200, 333, 576, "causal"), (40, 500, 96, 100, 576, "garbage"),
        (30, 64, 128, 257, 576, "stride4"), (25, 700, 128, 300, 512, "tlen"), (23, 300, 128, 100, 576, "noncontig"),
        (12, 5000, 128, 2048, 576, "causal"), (5, 20, 128, 64, 576, "dup"),
    ]
    for s_q, s_kv, h_q, topk, d_qk, kind in cases:
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=s_q * 7 + h_q)
        q, kv, idx, sc, qs = x["q"], x["kv"], x["indices"], x["sm_scale"], x["q_start"]
        kw = dict(q_start=qs)
        if kind == "garbage":
            junk = torch.randint(-2**31, 2**31 - 1, idx.shape, device=dev, dtype=torch.int64).to(torch.int32)
            junk[:, :4] = torch.tensor([-1, s_kv, 2**31 - 1, -2**31], dtype=torch.int32, device=dev)
            idx = torch.where(torch.rand(idx.shape, device=dev) < 0.5, idx, junk)
            kw = {}
        elif kind == "stride4":
            kw = dict(q_start=torch.tensor([100], dtype=torch.int32, device=dev), k_stride=4)
            idx = causal_indices(s_q, s_kv, topk, 100, dev, k_stride=4)
        elif kind == "tlen":
            kw["topk_length"] = torch.randint(0, topk + 3, (s_q,), dtype=torch.int32, device=dev)
        elif kind == "sink":
            kw["attn_sink"] = torch.randn(h_q, device=dev)
        elif kind == "noncontig":
            q = torch.randn(s_q, h_q * 2, d_qk + 64, dtype=torch.bfloat16, device=dev)[:, ::2, :d_qk]
            kv = torch.randn(s_kv, 1, d_qk + 64, dtype=torch.bfloat16, device=dev)[:, :, :d_qk]
        elif kind == "dup":
            idx = torch.randint(0, 4, idx.shape, dtype=torch.int32, device=dev)
            kw = {}
        idx[0] = -1  # a row with no valid index
        ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, sc, **kw)
        a = prepare(q, kv, idx, sc, **kw)
        for c in CFGS + ["triton"]:
            o, m, l = tri(a) if c == "triton" else ws(a, c)
            # out: P rounded to bf16 before P V (norm-wise ~2^-8); max_logits / lse: fp32 logits of exact inputs
            eo, em, el = rel_err(o, ro), rel_err(m, rm), rel_err(l, rl)
            ok = eo <= OUT_TOL[torch.bfloat16] and em <= STAT_TOL and el <= STAT_TOL
            fails += not ok
            print(f"{'ok ' if ok else 'FAIL'} {kind:<9} s_q={s_q} s_kv={s_kv} h_q={h_q} topk={topk} d_qk={d_qk} "
                  f"cfg={c} out {eo:.1e} maxl {em:.1e} lse {el:.1e}", flush=True)
    return fails


def timings():
    rows = []
    for h_q, topk, d_qk in [(128, 2048, 576), (64, 2048, 576), (16, 2048, 576), (128, 2048, 512), (128, 512, 576)]:
        s_q, s_kv = 4096, 8192
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        flop = 2 * s_q * topk * h_q * (d_qk + 512)
        ref = tri(a)
        variants = [("triton", lambda: tri(a))] + [(f"ws {c or 'default'}", lambda c=c: ws(a, c)) for c in CFGS]
        for name, fn in variants:
            try:
                o = fn()
                err = rel_err(o[0], ref[0])
                ms = triton.testing.do_bench(fn, warmup=30, rep=200)
            except Exception as e:  # noqa: BLE001
                print(f"h_q={h_q} {name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            rows.append(dict(h_q=h_q, topk=topk, d_qk=d_qk, impl=name, ms=ms, tflops=flop / ms / 1e9, err=err))
            print(f"fwd h_q={h_q:>3} topk={topk} d_qk={d_qk} {name:<24} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s "
                  f"err vs triton {err:.1e}", flush=True)
    json.dump(rows, open(f"{OUT}/fwd_gluon.json", "w"), indent=1)


def memcheck():
    s_q, s_kv, h_q, topk = 8, 100, 128, 96
    x = make_inputs(s_q, s_kv, h_q, topk, 576, torch.bfloat16, dev, seed=3)
    idx = torch.randint(-2**31, 2**31 - 1, (s_q, topk), device=dev, dtype=torch.int64).to(torch.int32)
    idx[:, :4] = torch.tensor([-1, s_kv, 2**31 - 1, -2**31], dtype=torch.int32, device=dev)
    idx[:, 4:40] = torch.randint(0, s_kv, (s_q, 36), dtype=torch.int32, device=dev)
    for h in (128, 64, 200):
        q = torch.randn(s_q, h, 576, dtype=torch.bfloat16, device=dev)
        ws(prepare(q, x["kv"], idx, 0.04, attn_sink=torch.randn(h, device=dev)))
    torch.cuda.synchronize()
    print("memcheck case ran")


if __name__ == "__main__" and "--memcheck" in sys.argv:
    memcheck()
elif __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    f = correctness()
    print(f"correctness failures: {f}")
    timings()
