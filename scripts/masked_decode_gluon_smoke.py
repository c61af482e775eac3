"""Smoke test of the Gluon work-stealing masked decode kernel against the fp32 reference (device; run it under
`timeout`: a wrong barrier count hangs). Usage: PYTHONPATH=. timeout 120 python scripts/masked_decode_gluon_smoke.py"""
import sys

import torch

from llmkernels.ops.combine.kernel import combine
from llmkernels.ops.masked_decode.kernel import _plan
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import make_inputs
from llmkernels.ops.masked_decode.steal_gluon import steal_launch

ctr = torch.zeros(4096, dtype=torch.int32, device="cuda")
cfgs = [dict(BLOCK_N=64, STAGES=3, PROD_REGS=56, maxnreg=128), dict(BLOCK_N=64, STAGES=6, PROD_REGS=56)]
fails = 0
for cfg in cfgs[int(sys.argv[1]):int(sys.argv[2])] if len(sys.argv) > 2 else cfgs:
    for (B, Hkv, G, L, D, kept, lens) in [(1, 8, 4, 4096, 128, 1.0, False), (3, 2, 4, 2011, 128, 0.5, True),
                                          (2, 2, 16, 777, 64, 0.3, False), (2, 4, 1, 1500, 128, 0.7, True)]:
        for dtype in (torch.float16, torch.bfloat16):
            x = make_inputs(B, Hkv, Hkv * G, L, D, dtype, torch.device("cuda"), kept=kept)
            x["drop"][-1, -1] = True  # a fully dropped row
            kl = torch.randint(0, L + 1, (B,), device="cuda", dtype=torch.int32) if lens else None
            ro, rl = masked_decode_ref(x["q"], x["k"], x["v"], x["drop"], kl)
            splits, _ = _plan(B, Hkv, L, torch.device("cuda"), 2 if cfg["STAGES"] == 3 else 1)
            op = torch.full((B * Hkv * G, splits, D), float("nan"), device="cuda")
            lp = torch.full((B * Hkv * G, splits), float("nan"), device="cuda")
            out = torch.full_like(x["q"], float("nan"))
            lse = torch.full((B, Hkv * G), float("nan"), device="cuda")
            for rep in range(2):  # the second call checks that the counters were reset
                steal_launch(x["q"], x["k"], x["v"], x["drop"], kl, L, D ** -0.5 * 1.4426950408889634, op, lp, ctr,
                             False, cfg)
                combine(op, lp, out.view(-1, D), lse.view(-1))
                torch.cuda.synchronize()
                eo = ((out.float() - ro).abs().max() / ro.abs().max().clamp_min(1e-6)).item()
                el = (lse - rl).abs().nan_to_num(0.0).max().item()
                same_inf = bool(((lse == float("-inf")) == (rl == float("-inf"))).all())
                ok = eo < 2e-2 and el < 1e-3 and same_inf and not out.isnan().any() and bool((ctr == 0).all())
                fails += not ok
                print("ok " if ok else "BAD", cfg["STAGES"], B, Hkv, G, L, D, kept, lens, str(dtype)[6:], rep,
                      f"out {eo:.2e} lse {el:.2e} inf-match {same_inf} ctr0 {bool((ctr == 0).all())}", flush=True)
print("FAILS", fails)
