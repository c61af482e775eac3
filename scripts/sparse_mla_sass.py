"""Compile the Gluon sparse MLA kernels for sm_90 WITHOUT a GPU and report registers, spills, shared memory and
instruction counts. Usage: python scripts/sparse_mla_sass.py [dump-dir]   (dump-dir gets ttgir / ptx / sass)"""
import os
import re
import sys

import sm90_offline as O  # noqa: I100  (installs the sm_90 stand-in driver first)
import torch

from llmkernels.ops.sparse_mla import attn_dist_wgmma as W  # noqa: E402
from llmkernels.ops.sparse_mla import bwd_wgmma as B  # noqa: E402
from llmkernels.ops.sparse_mla import common  # noqa: E402
from llmkernels.ops.sparse_mla import fwd_wgmma as F  # noqa: E402

common.check_same_device = lambda **kw: None  # CPU stand-ins for CUDA tensors


def report(name, k, dump=None):
    sass, res = O.sass(k)
    regs, stack = O.regs_stack(res)
    n = lambda pat: len(re.findall(pat, sass))  # noqa: E731
    print(f"{name:<40} regs {regs:>4} stack {stack:>4} smem {k.metadata.shared:>6} HGMMA {n(r'HGMMA'):>3} "
          f"LDGSTS {n(r'LDGSTS'):>3} LDL {n(r'LDL'):>3} BAR {n(r'BAR.SYNC'):>2} MUFU {n(r'MUFU'):>3}")
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            open(f"{dump}/{name.replace(' ', '_')}.{ext}", "w").write(k.asm[ext])
        open(f"{dump}/{name.replace(' ', '_')}.sass", "w").write(sass)


def _args(h_q, d_qk, sink=False):
    s_q, s_kv, topk = 4, 64, 96
    q = torch.empty(s_q, h_q, d_qk, dtype=torch.bfloat16)
    kv = torch.empty(s_kv, 1, d_qk, dtype=torch.bfloat16)
    idx = torch.zeros(s_q, topk, dtype=torch.int32)
    return common.prepare(q, kv, idx, 0.1, q_start=s_kv - s_q, k_stride=1,
                          attn_sink=torch.zeros(h_q) if sink else None)


def ws(name, h_q=128, d_qk=576, dump=None, **cfg):
    """attn_dist (attn_dist_wgmma._dist_ws_kernel; _dist_pair_kernel, the default at h_q <= 64 unless PAIR=0)."""
    a = _args(h_q, d_qk)
    s_q, topk = a.indices.shape
    kern = W._dist_pair_kernel if h_q <= 64 and cfg.get("PAIR", 1) else W._dist_ws_kernel
    k = O.compiled(kern, lambda: W.attn_dist_ws_launch(a, torch.empty(s_q, h_q), torch.empty(s_q, topk),
                                                                     config=cfg or None))
    report(name, k, dump)


def fwd(name, h_q=128, d_qk=576, dump=None, **cfg):
    """forward (fwd_wgmma._fwd_see_kernel), with an attention sink."""
    a = _args(h_q, d_qk, sink=True)
    s_q = a.q.shape[0]
    k = O.compiled(F._fwd_see_kernel, lambda: F.sparse_mla_fwd_ws_launch(
        a, torch.empty(s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(s_q, h_q), torch.empty(s_q, h_q),
        config=cfg or None))
    report(name, k, dump)


def bwd(name, second=False, h_q=128, d_qk=576, dump=None, deterministic=False, **cfg):
    """the backward's first pass (bwd_wgmma._probs_ws_kernel, with an lse gradient) or, with second, its second
    pass (_grads_ws_kernel: the last launch is reported, the rope columns at d_qk 576, the V columns at 512)."""
    a = _args(h_q, d_qk)
    s_q, topk = a.indices.shape
    o = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    lse = torch.empty(s_q, h_q)
    buf = torch.empty(s_q, h_q, topk, dtype=torch.bfloat16)
    if second:
        k = O.compiled(B._grads_ws_kernel, lambda: B.grads_ws_launch(
            a, o, buf, buf, torch.empty_like(a.q), torch.empty(64, d_qk), 0, s_q, B.grads_ws_heads(h_q),
            deterministic, config=cfg or None))
    else:
        k = O.compiled(B._probs_ws_kernel, lambda: B.probs_ws_launch(
            a, o, o, lse, lse, True, buf, buf, lse, torch.empty(s_q * topk, dtype=torch.int32), 0, s_q,
            deterministic, config=cfg or None))
    report(name, k, dump)


if __name__ == "__main__":
    dump = sys.argv[1] if len(sys.argv) > 1 else None
    ws("attn_dist h128 d576", dump=dump)
    ws("attn_dist h64 d576 (row pairs)", h_q=64)
    ws("attn_dist h64 d576 (one row)", h_q=64, PAIR=0)
    ws("attn_dist h128 d512", d_qk=512)
    ws("attn_dist h128 d576 2 stages", STAGES=2)
    fwd("fwd h128 d576", dump=dump)
    fwd("fwd h128 d512", d_qk=512)
    bwd("bwd PdS h128 d576", dump=dump)
    bwd("bwd PdS h128 d512 determ", d_qk=512, deterministic=True)
    bwd("bwd dQdKV h128 d512 (V columns)", second=True, d_qk=512, dump=dump)
    bwd("bwd dQdKV h128 d576 (rope)", second=True)
    bwd("bwd dQdKV h64 d512 determ", second=True, h_q=64, d_qk=512, deterministic=True)
