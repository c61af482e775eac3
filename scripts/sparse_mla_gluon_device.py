"""On the GPU: the Gluon sparse MLA kernels (attn_dist_wgmma.py, fwd_wgmma.py) against the fp32 reference and the
Triton kernels on edge cases, then timings at the record shapes (attn_dist also runs its gather-only probe = the
L2 gather ceiling). Usage (repo root, PYTHONPATH=.):
    python scripts/sparse_mla_gluon_device.py [dist] [fwd] [--check-only]    checks + timings (both ops by default)
    compute-sanitizer --tool memcheck python scripts/sparse_mla_gluon_device.py --memcheck
Results go to stdout and $OUT/gluon_<op>.json. Raw outputs of the 2026-11-23 rounds: benchmarks/notes/."""
import json
import os
import sys

import torch
import triton

from llmkernels.checking import rel_err
from llmkernels.ops.sparse_mla import attn_dist as TD
from llmkernels.ops.sparse_mla import attn_dist_wgmma as WD
from llmkernels.ops.sparse_mla import fwd as TF
from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.reference import sparse_mla_attn_dist_ref, sparse_mla_fwd_ref
from llmkernels.ops.sparse_mla.spec import OUT_TOL, STAT_TOL, causal_indices, make_inputs

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")
SHAPES = [(128, 2048, 576), (64, 2048, 576), (16, 2048, 576), (128, 2048, 512), (128, 512, 576)]
CONFIGS = {"dist": [None, dict(PAIR=0), dict(PAIR=0, STAGES=2), dict(SINGLES=0), dict(SINGLES=3)], "fwd": [None, dict(EARLY_S=0), dict(OSTAGE=0), dict(TAIL=0), dict(NSM=5), dict(NSM=3, EARLY_S=0)]}  # None: what the public ops run
I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def garbage(shape, s_kv):
    """Indices over the whole int32 range, the first four columns the classic invalid values."""
    junk = torch.randint(I32_MIN, I32_MAX, shape, device=dev, dtype=torch.int64).to(torch.int32)
    junk[:, :4] = torch.tensor([-1, s_kv, I32_MAX, I32_MIN], dtype=torch.int32, device=dev)
    return junk


def cases():
    """(name, q, kv, indices, kwargs) edge cases: every one also has a row with no valid index."""
    spec = [  # s_q, s_kv, h_q, topk, d_qk, kind
        (67, 300, 128, 200, 576, "causal"), (33, 150, 64, 130, 576, "sink"), (20, 90, 16, 77, 512, "causal"),
        (9, 40, 1, 64, 576, "causal"), (17, 1000, 200, 333, 576, "causal"), (40, 500, 96, 100, 576, "garbage"),
        (30, 64, 128, 257, 576, "stride4"), (25, 700, 128, 300, 512, "tlen"), (23, 300, 128, 100, 576, "noncontig"),
        (12, 5000, 128, 2048, 576, "causal"), (5, 20, 128, 64, 576, "dup"),
    ]
    for s_q, s_kv, h_q, topk, d_qk, kind in spec:
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=s_q * 7 + h_q)
        q, kv, idx = x["q"], x["kv"], x["indices"]
        kw = dict(q_start=x["q_start"])
        if kind == "garbage":
            idx = torch.where(torch.rand(idx.shape, device=dev) < 0.5, idx, garbage(idx.shape, s_kv))
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
        idx[0] = -1
        yield f"{kind:<9} s_q={s_q} s_kv={s_kv} h_q={h_q} topk={topk} d_qk={d_qk}", q, kv, idx, x["sm_scale"], kw


def run_dist(a, lse, cfg):
    out = torch.zeros(a.indices.shape, dtype=torch.float32, device=dev)
    if cfg == "triton":
        TD.attn_dist_launch(a, lse, out, config=TD.dist_config(a.q.shape[1], a.indices.shape[1], dev))
    else:
        WD.attn_dist_ws_launch(a, lse, out, config=cfg)
    return out


def run_fwd(a, cfg):
    s_q, h_q = a.q.shape[:2]
    o = (torch.full((s_q, h_q, 512), float("nan"), dtype=a.q.dtype, device=dev),
         torch.full((s_q, h_q), float("nan"), device=dev), torch.full((s_q, h_q), float("nan"), device=dev))
    if cfg == "triton":
        TF.sparse_mla_fwd_launch(a, *o, config=TF.fwd_config(h_q, a.indices.shape[1], dev))
    else:
        WF.sparse_mla_fwd_ws_launch(a, *o, config=cfg)
    return o


def check(op):
    fails = 0
    for name, q, kv, idx, sc, kw in cases():
        ro, rm, rl = sparse_mla_fwd_ref(q, kv, idx, sc, **kw)
        a = prepare(q, kv, idx, sc, **kw)
        if op == "dist":
            kw.pop("attn_sink", None)
            ref = sparse_mla_attn_dist_ref(q, kv, idx, rl, sc, **kw)
        for cfg in CONFIGS[op] + ["triton"]:
            if op == "dist":
                # summed probabilities: fp32 logits of exact inputs, only summation order / exp2 differ
                errs = [((run_dist(a, rl, cfg) - ref).abs() / (1 + ref.abs())).max().item()]
                ok = errs[0] < 1e-4  # NaN compares False
            else:
                o, m, l = run_fwd(a, cfg)
                # out: P rounded to bf16 before P V (~2^-8 norm-wise); max_logits / lse: fp32 logits
                errs = [rel_err(o, ro), rel_err(m, rm), rel_err(l, rl)]
                ok = errs[0] <= OUT_TOL[torch.bfloat16] and max(errs[1:]) <= STAT_TOL
            fails += not ok
            print(f"{'ok ' if ok else 'FAIL'} {op} {name} cfg={cfg} err {' '.join(f'{e:.1e}' for e in errs)}",
                  flush=True)
    return fails


def timings(op):
    rows = []
    for h_q, topk, d_qk in SHAPES:
        s_q, s_kv = 4096, 8192
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        if op == "dist":
            lse = run_fwd(a, None)[2]
            flop = 2 * s_q * h_q * d_qk * topk
            variants = [(f"{c or 'default'}", lambda c=c: run_dist(a, lse, c)) for c in ["triton"] + CONFIGS[op]]
            variants.append(("gather-only", lambda: run_dist(a, lse, dict(GATHER_ONLY=True))))
        else:
            flop = 2 * s_q * topk * h_q * (d_qk + 512)
            variants = [(f"{c or 'default'}", lambda c=c: run_fwd(a, c)) for c in ["triton"] + CONFIGS[op]]
            # probes of the Gluon forward: 1 = consumers alone (no gathers), 2 = producer alone (no math)
            variants += [(f"probe {k}", lambda k=k: run_fwd(a, dict(PROBE=k))) for k in (1, 2)]
        for name, fn in variants:
            fn()
            ms = triton.testing.do_bench(fn, warmup=30, rep=200)
            gather = s_q * topk * d_qk * 2 / ms / 1e9  # TB/s of kv rows moved L2 -> SM (once per 128 heads)
            rows.append(dict(op=op, h_q=h_q, topk=topk, d_qk=d_qk, impl=name, ms=ms, tflops=flop / ms / 1e9,
                             gather_tbs=gather))
            print(f"{op} h_q={h_q:>3} topk={topk} d_qk={d_qk} {name:<28} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s "
                  f"gather {gather:5.2f} TB/s", flush=True)
    json.dump(rows, open(f"{OUT}/gluon_{op}.json", "w"), indent=1)


def memcheck():
    s_q, s_kv, topk = 8, 100, 96
    kv = torch.randn(s_kv, 1, 576, dtype=torch.bfloat16, device=dev)
    idx = garbage((s_q, topk), s_kv)
    idx[:, 4:40] = torch.randint(0, s_kv, (s_q, 36), dtype=torch.int32, device=dev)
    for h in (128, 64, 200):
        q = torch.randn(s_q, h, 576, dtype=torch.bfloat16, device=dev)
        a = prepare(q, kv, idx, 0.04, attn_sink=torch.randn(h, device=dev))
        run_fwd(a, None)
        idx2 = garbage((s_q, 300), s_kv)  # three pairs: the split path (pieces, merge), also at 5 "SMs"
        idx2[:, 4:200] = torch.randint(0, s_kv, (s_q, 196), dtype=torch.int32, device=dev)
        a2 = prepare(q, kv, idx2, 0.04, attn_sink=torch.randn(h, device=dev))
        run_fwd(a2, None)
        run_fwd(a2, dict(NSM=5))
        run_dist(a, torch.randn(s_q, h, device=dev) + 30, None)
        if h <= 64:  # programs over pairs of rows (an odd s_q: the last row alone)
            for n in (s_q, s_q - 1):
                b = prepare(q[:n], kv, idx[:n], 0.04)
                run_dist(b, torch.randn(n, h, device=dev) + 30, dict(SINGLES=0))
    torch.cuda.synchronize()
    print("memcheck case ran")


if __name__ == "__main__":
    if "--memcheck" in sys.argv:
        memcheck()
        sys.exit(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    ops = [o for o in ("dist", "fwd") if o in sys.argv] or ["dist", "fwd"]
    failures = sum(check(op) for op in ops)
    print(f"correctness failures: {failures}")
    if "--check-only" not in sys.argv:
        for op in ops:
            timings(op)
    sys.exit(1 if failures else 0)
