"""A/B of the Gluon sparse MLA kernels on the record shapes: a copy of the previous kernels against the working
tree, same run, with a bitwise comparison of the outputs, fwd timelines (fwd_wgmma STAMP) and the public backward's
time; attn_dist new / head interleaved with their gather-only probes; config sweeps (dsweep: attn_dist, gsweep: the
backward's second pass).
Usage (repo root, PYTHONPATH=.): python scripts/sparse_mla_ab.py [128] [64] [fwd] [dist] [bwd] [dsweep] [gsweep] [K=V ...]
The previous kernels: mkdir llmkernels/ops/_sm_head; for f in __init__ common attn_dist_wgmma fwd_wgmma bwd_wgmma;
do git show REV:llmkernels/ops/sparse_mla/$f.py > llmkernels/ops/_sm_head/$f.py; done (untracked, never committed;
without it only the new kernels run).
Timeline points (STAMP), consumer 0: 0 pair start, 1 slot 0's early half landed, 2 S a done, 3 P a handed over
(P a V a issued), 4 m1 seen, 5 P a V a done, 6 P b seen, 7 P b V b done; consumer 1: 0 start, 1 slot 1's early half
landed, 2 m0 seen (O scaled), 3 P a seen (P a V a issued), 4 S b done, 5 P b handed over, 6 P a V a done, 7 P b V b
done. Medians over pairs 2-13 of every program, in clocks from consumer 0's pair start (one SM clock for both)."""
import importlib
import json
import os
import sys

import torch
import triton

from llmkernels.ops.sparse_mla import attn_dist_wgmma as WD
from llmkernels.ops.sparse_mla import fwd_wgmma as WF
from llmkernels.ops.sparse_mla.autograd import sparse_mla_bwd
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.spec import make_inputs

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")
try:
    HF = importlib.import_module("llmkernels.ops._sm_head.fwd_wgmma")
    HD = importlib.import_module("llmkernels.ops._sm_head.attn_dist_wgmma")
except ImportError:
    HF = HD = None
    print("no _sm_head package: new kernels only")
S_Q, S_KV, TOPK, D_QK = 4096, 8192, 2048, 576
rows = []


def fwd_out(mod, a, cfg):
    s_q, h_q = a.q.shape[:2]
    o = (torch.empty((s_q, h_q, 512), dtype=a.q.dtype, device=dev), torch.empty((s_q, h_q), device=dev),
         torch.empty((s_q, h_q), device=dev))
    mod.sparse_mla_fwd_ws_launch(a, *o, config=cfg)
    return o


def dist_out(mod, a, lse, cfg):
    out = torch.zeros(a.indices.shape, device=dev)
    mod.attn_dist_ws_launch(a, lse, out, config=cfg)
    return out


def timed(op, h_q, name, fn, flop):
    try:
        fn()
    except Exception as e:  # a config that does not fit (shared memory) must not stop the run
        print(f"{op} h_q={h_q:>3} {name:<22} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return float("nan")
    ms = triton.testing.do_bench(fn, warmup=30, rep=200)
    rows.append(dict(op=op, h_q=h_q, impl=name, ms=ms, tflops=flop / ms / 1e9))
    print(f"{op} h_q={h_q:>3} {name:<22} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s", flush=True)
    return ms


def timeline(a, cfg, ms):
    """Median clocks of each stamp point relative to consumer 0's pair start (pairs 2..13, every program), then
    where a program's time goes: entry -> q in smem -> first pair -> loop done -> exit, and the gap on the same SM
    between one program's exit and the next one's entry (%clock64 is per SM, so comparable there)."""
    n_prog = a.q.shape[0] * triton.cdiv(a.q.shape[1], 64)
    st = torch.zeros(n_prog, 2, 17, 8, dtype=torch.int64, device=dev)
    fwd_out(WF, a, {**cfg, "STAMP": 1, "stamp": st})
    torch.cuda.synchronize()
    s = st.double()
    rel = s[:, :, 2:14, :] - s[:, 0:1, 2:14, 0:1]
    med = rel.permute(1, 3, 0, 2).reshape(2, 8, -1).median(dim=2).values
    period = (s[:, 0, 3:15, 0] - s[:, 0, 2:14, 0]).flatten().median().item()
    prog = (s[:, 0, 15, 7] - s[:, 0, 0, 0]).median().item()
    print(f"    period {period:.0f} clk, program {prog:.0f} clk (~{prog * n_prog / 132 / (ms * 1e6):.2f} GHz if back "
          f"to back); c0 " + " ".join(f"{v:.0f}" for v in med[0].tolist()) + " | c1 "
          + " ".join(f"{v:.0f}" for v in med[1].tolist()), flush=True)
    p = st[:, 0, 16, :].double()  # consumer 0: entry, q ready, loop done, exit, smid
    md = lambda x: x.median().item()  # noqa: E731
    n_pairs = TOPK // 128
    print(f"    program (c0, clk): q ready {md(p[:, 1] - p[:, 0]):.0f}, first pair start "
          f"{md(s[:, 0, 0, 0] - p[:, 0]):.0f}, pair 0 {md(s[:, 0, 1, 0] - s[:, 0, 0, 0]):.0f}, "
          f"pair 1 {md(s[:, 0, 2, 0] - s[:, 0, 1, 0]):.0f}, "
          f"loop done -> exit {md(p[:, 3] - p[:, 2]):.0f}, entry -> exit {md(p[:, 3] - p[:, 0]):.0f} "
          f"(= {md(p[:, 3] - p[:, 0]) / period:.1f} periods for {n_pairs} pairs)", flush=True)
    for c in (0, 1):  # the epilogue, from this consumer's loop done: l exchanged, O normalised, in smem, exit
        q = st[:, c, 16, :].double()
        print(f"    c{c} epilogue (clk from its loop done): " + " ".join(
            f"{n} {md(q[:, k] - q[:, 2]):.0f}" for n, k in (("l", 5), ("norm", 6), ("smem", 7), ("exit", 3))),
            flush=True)
    sm, ent, ex = p[:, 4].long(), p[:, 0], p[:, 3]
    gaps = []
    for k in sm.unique().tolist():
        sel = (sm == k).nonzero().flatten()
        o = ent[sel].argsort()
        e, x = ent[sel][o], ex[sel][o]
        gaps.append(e[1:] - x[:-1])
    g = torch.cat(gaps)
    busy = (ex - ent).sum().item()
    span = sum((ex[sm == k].max() - ent[sm == k].min()).item() for k in sm.unique().tolist())
    print(f"    same-SM gap exit -> next entry: median {md(g):.0f} clk, p90 {g.quantile(0.9).item():.0f}; programs "
          f"per SM {n_prog / max(1, sm.unique().numel()):.1f}; busy / span {busy / span:.3f}", flush=True)
    torch.save(st.cpu(), f"{OUT}/stamps_h{a.q.shape[1]}_{'_'.join(f'{k}{v}' for k, v in cfg.items()) or 'default'}.pt")


def main():
    ops = [o for o in ("fwd", "dist", "bwd") if o in sys.argv]
    if not ops and not {"dsweep", "gsweep"} & set(sys.argv):
        ops = ["fwd", "dist", "bwd"]
    extra = {k: int(v) for k, v in (x.split("=") for x in sys.argv[1:] if "=" in x)}
    for h_q in [int(v) for v in sys.argv[1:] if v.isdigit()] or [128, 64]:
        x = make_inputs(S_Q, S_KV, h_q, TOPK, D_QK, torch.bfloat16, dev, seed=1)
        a = prepare(x["q"], x["kv"], x["indices"], x["sm_scale"], q_start=x["q_start"])
        if "fwd" in ops:
            flop = 2 * S_Q * TOPK * h_q * (D_QK + 512)
            ref = fwd_out(HF, a, None) if HF else None
            # the default and the K=V variant interleaved twice (drift hits both), with their consumer-only probes
            variants = [("new", {}), ("new probe1", dict(PROBE=1))]
            if extra:
                variants = [("new", {}), ("new +cfg", extra), ("new probe1", dict(PROBE=1)),
                            ("new +cfg probe1", {**extra, "PROBE": 1}), ("new again", {}), ("new +cfg again", extra)]
            if HF:  # head first as well as last: timed only last, it read 5-10 % low (sparse_mla_fwd_np_runs.txt)
                timed("fwd", h_q, "head first", lambda: fwd_out(HF, a, None), flop)
            for name, cfg in variants:
                ms = timed("fwd", h_q, name, lambda cfg=cfg: fwd_out(WF, a, cfg), flop)
                if "probe" not in name:
                    if ref is not None:
                        o = fwd_out(WF, a, cfg)
                        print(f"    bitwise equal to head: {all(torch.equal(u, v) for u, v in zip(o, ref))}, out max "
                              f"abs diff {(o[0].float() - ref[0].float()).abs().max().item():.1e}")
                    timeline(a, cfg, ms)
            if HF:
                timed("fwd", h_q, "head", lambda: fwd_out(HF, a, None), flop)
        if "dist" in ops:  # interleaved new / head twice, so that drift hits both; gather-only = the producer alone
            flop = 2 * S_Q * h_q * D_QK * TOPK
            lse = fwd_out(WF, a, None)[2]
            variants = [("new +cfg", extra)] if extra else []  # K=V arguments: a config timed beside the default
            base = dist_out(WD, a, lse, None) if HD or variants else None
            if HD:
                print(f"    bitwise equal to head: {torch.equal(base, dist_out(HD, a, lse, None))}")
            for n, c in variants:
                d = dist_out(WD, a, lse, c)
                print(f"    {n}: bitwise equal to the default: {torch.equal(d, base)}, max abs diff "
                      f"{(d - base).abs().max().item():.2e}", flush=True)
            for _ in range(2):
                for name, mod, c in [("new", WD, None)] + [(n, WD, c) for n, c in variants] + (
                        [("head", HD, None)] if HD else []):
                    timed("dist", h_q, name, lambda mod=mod, c=c: dist_out(mod, a, lse, c), flop)
                    timed("dist", h_q, f"{name} gather-only",
                          lambda mod=mod, c=c: dist_out(mod, a, lse, {**(c or {}), "GATHER_ONLY": True}), flop)
        if "dsweep" in sys.argv:  # attn_dist configs (the public op runs None)
            flop = 2 * S_Q * h_q * D_QK * TOPK
            lse = fwd_out(WF, a, None)[2]
            ref = dist_out(WD, a, lse, None)
            for cfg in [None, dict(STAGES=3, PROD_REGS=48), dict(STAGES=3, PROD_REGS=56), dict(STAGES=2, PROD_REGS=48)]:
                timed("dist", h_q, str(cfg), lambda cfg=cfg: dist_out(WD, a, lse, cfg), flop)
                err = ((dist_out(WD, a, lse, cfg) - ref).abs() / (1 + ref.abs())).max().item()
                print(f"    max rel diff to the default {err:.1e}")
        if "gsweep" in sys.argv:  # the backward's Gluon second pass (g_ws overrides)
            from llmkernels.ops.sparse_mla.bwd import sparse_mla_bwd_launch
            flop = 2 * S_Q * TOPK * h_q * (2 * 512 + 3 * D_QK)
            o, _, lse = fwd_out(WF, a, None)
            do = torch.randn_like(o)
            dq = torch.empty_like(a.q)
            # with K=V arguments: the default and that config interleaved twice
            for g in [None, extra, None, extra] if extra else [None, dict(DC=128), dict(DC=128, STAGES=3), dict(NB=2)]:
                timed("bwd", h_q, f"g_ws={g}", lambda g=g: sparse_mla_bwd_launch(
                    a, o, do, lse, None, dq, deterministic=False, config=None if g is None else dict(g_ws=g)), flop)
        if "bwd" in ops:
            flop = 2 * S_Q * TOPK * h_q * (2 * 512 + 3 * D_QK)
            o, _, lse = fwd_out(WF, a, None)
            do = torch.randn_like(o)
            for det in (False, True):
                timed("bwd", h_q, "det" if det else "default",
                      lambda det=det: sparse_mla_bwd(a.q, a.kv, o, do, x["indices"], lse, x["sm_scale"],
                                                     q_start=x["q_start"], deterministic=det), flop)
    json.dump(rows, open(f"{OUT}/sparse_mla_ab.json", "w"), indent=1)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    main()
