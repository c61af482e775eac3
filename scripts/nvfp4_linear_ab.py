"""nvfp4_linear on the GPU: the packed-pair decode (inline asm, default) against the element-wise decode
(use_asm=False), bit for bit, and timed side by side (graph replay, inputs rotated beyond 3x L2); with --mma also
the register-fed mma kernel for T <= 16 (cfg {"kernel": "mma"}, against the reference) in a few configs.

Usage (device, repo root, PYTHONPATH=.): python scripts/nvfp4_linear_ab.py. Output also in $OUT/nvfp4_linear_ab.txt.
"""
import math
import sys

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4_gemv.kernel import linear_launch
from llmkernels.ops.nvfp4_gemv.reference import nvfp4_linear_ref
from llmkernels.ops.nvfp4_gemv.spec import LINEAR_TOL, linear_bytes, random_scales

from _say import teller  # noqa: E402  (scripts/ is on sys.path when run as a script)

say = teller("nvfp4_linear_ab.txt")


dev = torch.device("cuda")
MMA = "--mma" in sys.argv
MMA_CFGS = [{}, {"programs_per_sm": 12}]


def inputs(T, N, K, dtype):
    """Full-range weight bytes (all 16 codes, both signs) and scales over the e4m3 range."""
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
    s = random_scales((N, K // 16), dev, 0x08, 0x60).view(torch.uint8)
    x = torch.randn(T, K, device=dev).to(dtype)
    gs = torch.full((1,), 0.37, device=dev)
    return x, w, s, gs


bad = 0
for T, N, K, dtype in [(1, 37, 96, torch.bfloat16), (3, 300, 1024, torch.float16), (16, 129, 4096, torch.bfloat16),
                       (7, 4096, 4096, torch.float16), (1, 14336, 4096, torch.bfloat16), (16, 4096, 14336, torch.float16),
                       (8, 77, 1040, torch.bfloat16), (5, 1000, 14336, torch.bfloat16)]:
    x, w, s, gs = inputs(T, N, K, dtype)
    bias = torch.randn(N, device=dev)
    ref = nvfp4_linear_ref(x, w, s.view(torch.float8_e4m3fn), gs, bias)
    ys = []
    for asm in (False, True):  # the dot kernel with each decode
        y = torch.full((T, N), float("nan"), dtype=dtype, device=dev)
        linear_launch(x, w, s, gs, bias, y, cfg={"kernel": "dot"}, use_asm=asm)
        ys.append(y)
    torch.cuda.synchronize()
    err = rel_err(ys[1], ref)
    same = torch.equal(ys[0], ys[1])
    ok = err <= LINEAR_TOL[dtype] and same
    bad += not ok
    say(f"check T={T} N={N} K={K} {str(dtype)[6:]}: rel err {err:.1e}, bitwise equal to the element-wise decode: {same}"
        f"{'' if ok else '  WRONG'}")
    if MMA and T <= 16:
        for cfg in MMA_CFGS:
            y = torch.full((T, N), float("nan"), dtype=dtype, device=dev)
            linear_launch(x, w, s, gs, bias, y, cfg={"kernel": "mma", **cfg})
            torch.cuda.synchronize()
            e2 = rel_err(y, ref)
            bad += not e2 <= LINEAR_TOL[dtype]
            say(f"   mma {cfg}: rel err {e2:.1e}{'' if e2 <= LINEAR_TOL[dtype] else '  WRONG'}")
say(f"correctness: {bad} wrong")

bw = copy_bandwidth()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
say(f"copy {bw / 1e12:.3f} TB/s")
rows = []
variants = [("element-wise", {"use_asm": False}), ("packed asm", {"cfg": {"kernel": "dot"}})]
if MMA:
    variants += [(f"mma {c}", {"cfg": {"kernel": "mma", **c}}) for c in MMA_CFGS]
for N, K in [(4096, 4096), (14336, 4096), (4096, 14336)]:
    for T in ((1, 4, 8, 16) if MMA else (1, 4, 16)):
        nbytes = linear_bytes(T, N, K)
        floor = nbytes / bw * 1e3
        sets = [inputs(T, N, K, torch.bfloat16) for _ in range(min(max(3, math.ceil(3 * l2 / nbytes)), 24))]
        ys = [torch.empty(T, N, dtype=torch.bfloat16, device=dev) for _ in sets]
        res = {}
        for name, kw in variants:
            fns = [lambda z=z, y=y, kw=kw: linear_launch(z[0], z[1], z[2], z[3], None, y, **kw) for z, y in zip(sets, ys)]
            res[name] = 100 * floor / _graph_time_ms(fns, calls=max(len(fns), 32), reps=15)
        rows.append((N, K, T, res))
        say(f"N={N} K={K} T={T} (floor {floor * 1e3:.2f} us): " + ", ".join(f"{n} {p:.1f} %" for n, p in res.items()))
        del sets, ys
