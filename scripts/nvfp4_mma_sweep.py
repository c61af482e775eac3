"""nvfp4_gemv: the tensor-core kernel (gemv_mma.py) against the portable kernel, per shape and config, on the GPU.

Run from the repo root: `python scripts/nvfp4_mma_sweep.py [budget_seconds] [variant-substring ...]`.
Per shape (3 contest + 3 Llama): every variant on fresh full-range random inputs against the fp32 reference, then
timed like the harness (graph replay of 32 back-to-back calls, inputs rotated beyond 3x L2), beside the portable
kernel's plan (default and static weights) and a read-only stream over the same bytes (without and with PDL).
Prints one row per (variant, shape) and a table of % of floor; full output under $OUT.
"""
import json
import math
import os
import sys
import time
import traceback

import torch
import triton

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4_gemv import gemv_mma
from llmkernels.ops.nvfp4_gemv.kernel import _blocks, gemv_launch, gemv_plan
from llmkernels.ops.nvfp4_gemv.reference import nvfp4_gemv_ref
from llmkernels.ops.nvfp4_gemv.spec import GEMV_SHAPES, GEMV_TOL, gemv_bytes, make_inputs
from nvfp4_pdl_sweep import read_call
import triton.language as tl

T0 = time.monotonic()
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 240.0
ONLY = sys.argv[2:]
OUT = os.environ.get("OUT")
LOG = []
STATIC = dict(pdl=True, pre=1, trigger="entry")


def log(s=""):
    print(s, flush=True)
    LOG.append(s)


@triton.jit(do_not_specialize=["one"])
def _frag_read_kernel(a_ptr, sa_ptr, out_ptr, M, KB, one, s_al, s_am, s_sal, s_sam,
                      R: tl.constexpr, W: tl.constexpr, NB: tl.constexpr):
    """Read-only probe with the mma kernel's access pattern: warp w of a program (16 R rows) takes K tiles of 4 NB
    blocks w, w + W, ...; lane 4g + t reads blocks NB t .. NB t + NB - 1 of rows g and g + 8 of each group (one
    vector load a row) and NB scale bytes; xor-reduces what it read and stores one word per thread."""
    pid = tl.program_id(0)
    l = tl.program_id(1).to(tl.int64)
    e = tl.arange(0, 32 * W)
    g = (e % 32) // 4
    t = (e % 4) * one
    w = (e // 32) * one
    j = tl.arange(0, NB)[None, :]
    acc = tl.zeros([32 * W], tl.int64)
    for i in range(0, tl.cdiv(tl.cdiv(KB, 4 * NB), W)):
        kb = 4 * NB * (i * W + w) + NB * t
        for r in tl.static_range(2 * R):
            row = (pid * (16 * R) + 8 * r + g).to(tl.int64)
            ok = (kb[:, None] + j < KB) & (row < M)[:, None]
            v = tl.load((a_ptr + l * s_al + row * s_am + kb)[:, None] + j, mask=ok, other=0)
            sv = tl.load((sa_ptr + l * s_sal + row * s_sam + kb)[:, None] + j, mask=ok, other=0)
            acc ^= tl.reduce(v, 1, _xor) ^ tl.reduce(sv.to(tl.int64), 1, _xor)
    tl.store(out_ptr + (l * tl.num_programs(0) + pid) * (32 * W) + e, acc)


@triton.jit
def _xor(a, b):
    return a ^ b


def frag_read_call(x, R, W, NB):
    a8, sa8 = x["a"].view(torch.uint8), x["sfa"].view(torch.uint8)
    M, KH, L = a8.shape
    a64 = _blocks(a8)
    grid = (triton.cdiv(M, 16 * R), L)
    out = torch.empty(grid[0] * L * 32 * W, dtype=torch.int64, device="cuda")
    return lambda: _frag_read_kernel[grid](a64, sa8, out, M, KH // 8, 1, a64.stride(0), a64.stride(1),
                                           sa8.stride(2), sa8.stride(0), R=R, W=W, NB=NB, num_warps=W)


def variants(M, KB, L, dev):
    """(name, (kind, cfg)); mma configs: R row groups a warp, W warps along K (tiles of 16 blocks)."""
    plan = lambda R, W, **kw: ("mma", {**gemv_mma.mma_plan(M, KB, L, dev, R=R, W=W), **kw})  # noqa: E731
    v = [("old plan", ("old", gemv_plan(M, KB, L, dev))), ("old static", ("old", gemv_plan(M, KB, L, dev, True)))]
    lay = [(1, 4), (1, 8), (2, 4), (2, 8), (1, 16), (4, 4)]
    for R, W in lay:
        v.append((f"mma R{R} W{W}", plan(R, W)))
    for R, W in lay[:5]:
        v.append((f"mma R{R} W{W} static", plan(R, W, **STATIC)))
    v += [("read-only", ("read", False)), ("read-only pdl", ("read", True))]
    for R, W, NB in ((1, 4, 4), (2, 4, 4), (2, 4, 2), (1, 8, 4), (2, 8, 2)):
        v.append((f"read frag R{R} W{W} {32 * NB}B", ("frag", (R, W, NB))))
    return [x for x in v if not ONLY or any(o in x[0] for o in ONLY)]


def call(kind, cfg, x):
    a, b, sa, sb = (x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
    if kind == "old":
        return lambda: gemv_launch(a, b, sa, sb, x["c"], 1.0, cfg=cfg)
    return lambda: gemv_mma.launch_gemv(a, b, sa, sb, x["c"], 1.0, cfg=cfg)


def main():
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    log(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; triton {triton.__version__}; "
        f"copy {bw / 1e12:.3f} TB/s; L2 {l2 / 2**20:.0f} MiB; commit {os.environ.get('LLMKERNELS_COMMIT', '?')}")
    rows = []
    shapes = [tuple(int(v) for v in os.environ["SHAPES"].split(","))] if "SHAPES" in os.environ else GEMV_SHAPES
    for M, K, L in shapes:
        nbytes = gemv_bytes(M, K, L)
        floor_us = nbytes / bw * 1e6
        sets = min(max(1, math.ceil(3 * l2 / nbytes)), 32)
        xs = [make_inputs(M, K, L, dev) for _ in range(sets)]  # fresh full-range random bytes
        ref = nvfp4_gemv_ref(xs[0]["a"], xs[0]["b"], xs[0]["sfa"], xs[0]["sfb"])
        log(f"-- M={M} K={K} L={L}: floor {floor_us:.2f} us, {sets} input sets, mma plan "
            f"{gemv_mma.mma_plan(M, K // 16, L, dev)}")
        for name, (kind, cfg) in variants(M, K // 16, L, dev):
            if time.monotonic() - T0 > BUDGET:
                log(f"   {name:<24} skipped (budget {BUDGET:.0f} s spent)")
                continue
            try:
                if kind == "read":
                    fns, err = [read_call(x, cfg) for x in xs], float("nan")
                elif kind == "frag":
                    fns, err = [frag_read_call(x, *cfg) for x in xs], float("nan")
                else:
                    x0 = dict(xs[0], c=torch.full_like(xs[0]["c"], float("nan")))
                    call(kind, cfg, x0)()
                    torch.cuda.synchronize()
                    err = rel_err(x0["c"], ref)
                    if not err <= GEMV_TOL:
                        raise RuntimeError(f"rel err {err:.2e} > {GEMV_TOL}")
                    fns = [call(kind, cfg, x) for x in xs]
                us = _graph_time_ms(fns, calls=32, reps=15) * 1e3
                pct = 100 * floor_us / us
                rows.append(dict(variant=name, M=M, K=K, L=L, us=us, pct=pct, err=err, cfg=str(cfg)))
                log(f"   {name:<24} {us:8.2f} us {pct:6.1f} %  err {err:.1e}")
            except Exception as e:  # noqa: BLE001
                log(f"   {name:<24} FAILED {type(e).__name__}: {str(e)[:300]}")
                LOG.append(traceback.format_exc())
                rows.append(dict(variant=name, M=M, K=K, L=L, error=f"{type(e).__name__}: {e}"[:400]))
                torch.cuda.synchronize()
        del xs, ref
        torch.cuda.empty_cache()
    names = list(dict.fromkeys(r["variant"] for r in rows))
    log("\n% of floor per shape:")
    log(f"{'variant':<24}" + "".join(f"{f'{M}x{K}x{L}':>15}" for M, K, L in GEMV_SHAPES))
    for n in names:
        cells = []
        for M, K, L in GEMV_SHAPES:
            r = [r for r in rows if r["variant"] == n and (r["M"], r["K"], r["L"]) == (M, K, L)]
            cells.append("-" if not r else ("FAIL" if "error" in r[0] else f"{r[0]['pct']:.1f}"))
        log(f"{n:<24}" + "".join(f"{c:>15}" for c in cells))
    log(f"total {time.monotonic() - T0:.0f} s")
    if OUT:
        with open(os.path.join(OUT, "nvfp4_mma_sweep.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        with open(os.path.join(OUT, "nvfp4_mma_sweep.json"), "w") as f:
            json.dump(dict(copy_bw=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
