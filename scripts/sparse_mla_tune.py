"""On the GPU: time sparse_mla fwd / attn_dist kernel configs at the benchmark shapes, check each against the
fp32 reference on a sample of rows, and print a table (JSON lines to $OUT/tune.json)."""
import json
import os
import sys

import torch
import triton

from llmkernels.checking import rel_err
from llmkernels.ops.sparse_mla.attn_dist import attn_dist_launch, dist_config
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.fwd import fwd_config, sparse_mla_fwd_launch
from llmkernels.ops.sparse_mla.reference import sparse_mla_attn_dist_ref, sparse_mla_fwd_ref
from llmkernels.ops.sparse_mla.spec import make_inputs

S_Q, S_KV, TOPK, D = 4096, 8192, 2048, 576
FWD = [(64, 16, 8, 2), (64, 16, 8, 3), (64, 32, 8, 2), (64, 32, 8, 3), (64, 32, 8, 4), (64, 64, 8, 2),
       (64, 64, 8, 3), (32, 32, 4, 2), (32, 64, 4, 3)]
DIST = {128: [(128, 16, 8, 2), (128, 16, 8, 3), (128, 32, 8, 2), (128, 32, 8, 3), (64, 32, 8, 3), (64, 64, 8, 2)],
        64: [(64, 16, 8, 3), (64, 32, 8, 2), (64, 32, 8, 3), (64, 64, 8, 2), (64, 64, 8, 3), (64, 64, 4, 2),
             (64, 32, 4, 3)]}
SAMPLE = [(0, 32), (S_Q - 32, S_Q)]


def cfg_dict(c):
    return dict(BLOCK_H=c[0], BLOCK_N=c[1], num_warps=c[2], num_stages=c[3])


def main(which):
    out_dir = os.environ.get("OUT", ".")
    rows = []
    for h in (128, 64):
        x = make_inputs(S_Q, S_KV, h, TOPK, D, torch.bfloat16, torch.device("cuda"), seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        refs = [sparse_mla_fwd_ref(x["q"][r0:r1], x["kv"], x["indices"][r0:r1], x["sm_scale"],
                                   q_start=x["q_start"] + r0) for r0, r1 in SAMPLE]
        lse = torch.empty(S_Q, h, device="cuda")
        sparse_mla_fwd_launch(a, torch.empty(S_Q, h, 512, dtype=torch.bfloat16, device="cuda"),
                              torch.empty(S_Q, h, device="cuda"), lse)
        dref = [sparse_mla_attn_dist_ref(x["q"][r0:r1], x["kv"], x["indices"][r0:r1], lse[r0:r1], x["sm_scale"],
                                         q_start=x["q_start"] + r0) for r0, r1 in SAMPLE]
        kinds = []
        if which in ("fwd", "all"):
            kinds.append(("fwd", FWD, fwd_config(h, TOPK, a.q.device)))
        if which in ("dist", "all"):
            kinds.append(("dist", DIST[h], dist_config(h, TOPK, a.q.device)))
        for kind, cfgs, default in kinds:
            flops = 2 * S_Q * TOPK * h * (D + 512) if kind == "fwd" else 2 * S_Q * h * D * TOPK
            for c in cfgs:
                cfg = cfg_dict(c)
                if kind == "fwd":
                    o = torch.full((S_Q, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
                    m = torch.full((S_Q, h), float("nan"), device="cuda")
                    l_ = torch.full((S_Q, h), float("nan"), device="cuda")
                    fn = lambda: sparse_mla_fwd_launch(a, o, m, l_, config=cfg)  # noqa: E731
                else:
                    o = torch.zeros(S_Q, TOPK, device="cuda")
                    fn = lambda: attn_dist_launch(a, lse, o.zero_(), config=cfg)  # noqa: E731
                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:  # e.g. out of shared memory
                    print(f"{kind} h={h} {c}: {type(e).__name__} {str(e)[:120]}", flush=True)
                    continue
                if kind == "fwd":
                    err = max(max(rel_err(o[r0:r1], ro[0]), 10 * rel_err(l_[r0:r1], ro[2]))
                              for (r0, r1), ro in zip(SAMPLE, refs))
                    err = max(err, float("inf") if o.isnan().any() else 0.0)
                else:
                    err = max(rel_err(o[r0:r1], rd) for (r0, r1), rd in zip(SAMPLE, dref))
                ms = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
                r = dict(kind=kind, h_q=h, cfg=c, ms=ms, tflops=flops / ms / 1e9, err=err,
                         default=(cfg == default))
                rows.append(r)
                print(f"{kind:5} h={h:3} BH={c[0]:3} BN={c[1]:3} w={c[2]} s={c[3]}  {ms:7.3f} ms  "
                      f"{r['tflops']:6.1f} TFLOP/s  err {err:.1e}{'  (default)' if r['default'] else ''}", flush=True)
        del x, a
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "tune.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\nbest per (kind, h_q):")
    for key in sorted({(r["kind"], r["h_q"]) for r in rows}):
        ok = [r for r in rows if (r["kind"], r["h_q"]) == key and r["err"] < 2e-2]
        b = min(ok, key=lambda r: r["ms"])
        print(f"  {key[0]:5} h={key[1]:3} {b['cfg']} {b['ms']:.3f} ms {b['tflops']:.1f} TFLOP/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
