"""Where does a pair of tiles go in the Gluon sparse MLA forward? %clock64 stamps (fwd_wgmma STAMP=1) of both
consumers at 8 points per pair, on the record shape, next to the plain timings. Usage (repo root, PYTHONPATH=.):
    python scripts/sparse_mla_fwd_timeline.py [h_q ...] [--cfg KEY=VAL ...]
Points, consumer 0: 0 top, 1 slot 0 early half landed, 2 S a done, 3 softmax done (P a V a issued), 4 m1 seen,
5 P a V a done, 6 P b seen, 7 P b V b done. Consumer 1: 0 top, 1 slot 1 early half landed, 2 S b done, 3 m0 seen,
4 P b published, 5 P a seen, 6 P a V a done, 7 P b V b done. Both consumers read the same SM clock."""
import json
import os
import sys

import torch
import triton

from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")


def run(a, cfg):
    s_q, h_q = a.q.shape[:2]
    o = (torch.empty((s_q, h_q, 512), dtype=a.q.dtype, device=dev), torch.empty((s_q, h_q), device=dev),
         torch.empty((s_q, h_q), device=dev))
    WF.sparse_mla_fwd_ws_launch(a, *o, config=cfg)
    return o


def parse_cfg(argv):
    cfg = {}
    for x in argv:
        if "=" in x:
            k, v = x.split("=")
            cfg[k] = int(v)
    return cfg


def main():
    heads = [int(x) for x in sys.argv[1:] if x.isdigit()] or [128, 64]
    extra = parse_cfg(sys.argv[1:])
    res = {}
    for h_q in heads:
        s_q, s_kv, topk, d_qk = 4096, 8192, 2048, 576
        x = make_inputs(s_q, s_kv, h_q, topk, d_qk, torch.bfloat16, dev, seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        flop = 2 * s_q * topk * h_q * (d_qk + 512)
        n_prog = s_q * triton.cdiv(h_q, 64)
        stamps = torch.zeros(n_prog, 2, 16, 8, dtype=torch.int64, device=dev)
        for name, cfg in [("default", {}), ("probe1", dict(PROBE=1)), ("stamp", dict(STAMP=1, stamp=stamps)),
                          ("probe1+stamp", dict(PROBE=1, STAMP=1, stamp=stamps))]:
            cfg = {**cfg, **extra}
            run(a, cfg)
            ms = triton.testing.do_bench(lambda: run(a, cfg), warmup=30, rep=200)
            print(f"h_q={h_q} {name:<14} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s", flush=True)
            if "stamp" not in name:
                continue
            stamps.zero_()
            run(a, cfg)
            torch.cuda.synchronize()
            s = stamps.double()
            base = s[:, 0:1, :, 0:1]  # consumer 0's pair start
            mid = s[:, :, 2:14, :]  # steady pairs
            rel = (mid - base[:, :, 2:14, :]).reshape(n_prog, 2, 12, 8)
            med = rel.flatten(0, 0).permute(1, 3, 0, 2).reshape(2, 8, -1).median(dim=2).values
            period = (s[:, 0, 3:15, 0] - s[:, 0, 2:14, 0]).flatten().median().item()
            prog_cyc = (s[:, 0, 15, 7] - s[:, 0, 0, 0]).median().item()
            ghz = prog_cyc * n_prog / 132 / (ms * 1e6)  # one program per SM at a time
            print(f"  pair period (median) {period:.0f} clk; program {prog_cyc:.0f} clk for 16 pairs; "
                  f"implied clock ~{ghz:.2f} GHz (assumes back-to-back programs)")
            for c in range(2):
                print(f"  consumer {c}: " + " ".join(f"p{k}={med[c, k].item():6.0f}" for k in range(8)))
            res[f"{h_q}_{name}"] = dict(ms=ms, period=period, prog_cyc=prog_cyc, med=med.tolist())
    json.dump(res, open(f"{OUT}/fwd_timeline.json", "w"), indent=1)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    main()
