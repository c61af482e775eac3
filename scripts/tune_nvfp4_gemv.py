"""Sweep nvfp4_gemv / nvfp4_linear launch configs on the GPU (graph-timed, inputs rotated beyond L2).

Prints, per shape, the plan's config, the best config and the integer fallback (no inline asm), as % of the
memory floor measured against the copy rate of this run.
"""
import itertools
import math
import sys

import torch
import triton
import triton.language as tl

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch, gemv_plan, gemv_tile, linear_launch, linear_plan
from llmkernels.ops.nvfp4_gemv.reference import nvfp4_gemv_ref, nvfp4_linear_ref
from llmkernels.ops.nvfp4_gemv.spec import (GEMV_SHAPES, LINEAR_SHAPES, LINEAR_TOKENS, gemv_bytes, linear_bytes,
                                            make_inputs, make_linear_inputs)

bw = copy_bandwidth()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
print(f"copy {bw / 1e12:.3f} TB/s, L2 {l2 / 2**20:.0f} MiB", flush=True)


def sets_for(nbytes):
    return min(max(1, math.ceil(3 * l2 / nbytes)), 32)


def timed(fns):
    try:
        return _graph_time_ms(fns, calls=32, reps=15)
    except Exception as e:  # noqa: BLE001
        print("   fail", type(e).__name__, str(e)[:300], flush=True)
        return float("inf")


@triton.jit
def _read_kernel(p, out, n, BLOCK: tl.constexpr):
    """Read-only stream (xor-reduce of int64 words): what any kernel reading these bytes can reach."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(p + offs, mask=offs < n, other=0)
    tl.store(out + tl.program_id(0), tl.reduce(v, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def read_call(x):
    words = torch.cat([x["a"].view(torch.uint8).permute(2, 0, 1).reshape(-1),
                       x["sfa"].view(torch.uint8).permute(2, 0, 1).reshape(-1)])
    words = words[: words.numel() // 8 * 8].view(torch.int64)
    out = torch.empty(triton.cdiv(words.numel(), 2048), dtype=torch.int64, device="cuda")
    return lambda: _read_kernel[(out.numel(),)](words, out, words.numel(), BLOCK=2048, num_warps=4)


def gemv_call(x, cfg, use_asm=True):
    a, b, sa, sb = (x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
    return lambda: gemv_launch(a, b, sa, sb, x["c"], 1.0, cfg=cfg, use_asm=use_asm)


rows = []
only = sys.argv[1] if len(sys.argv) > 1 else "all"
if only in ("all", "gemv"):
    for M, K, L in GEMV_SHAPES:
        nbytes = gemv_bytes(M, K, L)
        floor = nbytes / bw * 1e3
        xs = [make_inputs(M, K, L, torch.device("cuda")) for _ in range(sets_for(nbytes))]
        plan = gemv_plan(M, K // 16, L, torch.device("cuda"))
        ref = nvfp4_gemv_ref(xs[0]["a"], xs[0]["b"], xs[0]["sfa"], xs[0]["sfb"])
        cfgs = [plan]
        # (R rows per thread, BB blocks per tile, warps, prefetch): layouts with no in-loop layout conversion
        for R, BB, nw, pf in [(1, 256, 4, 0), (2, 256, 4, 0), (4, 256, 4, 0), (8, 256, 4, 0), (2, 256, 4, 1),
                              (4, 256, 4, 1), (8, 256, 4, 1), (1, 512, 8, 0), (2, 512, 8, 0), (4, 512, 8, 0),
                              (1, 1024, 4, 0), (2, 1024, 8, 0), (2, 128, 2, 0), (4, 128, 2, 0), (8, 128, 2, 0),
                              (2, 128, 2, 1), (4, 64, 1, 0), (8, 64, 1, 0), (1, 64, 4, 0), (2, 64, 4, 0),
                              (4, 64, 4, 0), (8, 64, 4, 0), (4, 64, 4, 1), (2, 32, 4, 0)]:
            if BB > 2 * K // 16:
                continue
            cfgs.append(dict(BM=gemv_tile(BB, R, nw), BB=BB, num_warps=nw, split=1, num_stages=1, prefetch=bool(pf)))
        res = []
        for cfg in cfgs:
            c = gemv_call(xs[0], cfg)()
            err = rel_err(c, ref)
            ms = timed([gemv_call(x, cfg) for x in xs]) if err <= 1e-3 else float("inf")
            res.append((ms, cfg))
            print(f"  gemv {M}x{K}x{L} {cfg} err {err:.1e} {ms * 1e3:.2f} us {100 * floor / ms:.1f}%", flush=True)
        ms_noasm = timed([gemv_call(x, plan, False) for x in xs]) if "--no-asm" in sys.argv else float("inf")
        ms_read = timed([read_call(x) for x in xs])
        best = min(res, key=lambda r: r[0])
        rows.append(f"gemv M={M} K={K} L={L} floor {floor * 1e3:.2f}us | plan {res[0][0] * 1e3:.2f}us "
                    f"{100 * floor / res[0][0]:.1f}% | best {best[0] * 1e3:.2f}us {100 * floor / best[0]:.1f}% "
                    f"{best[1]} | no-asm {100 * floor / ms_noasm:.1f}% | read-only stream {ms_read * 1e3:.2f}us "
                    f"{100 * floor / ms_read:.1f}%")
        top = sorted(res, key=lambda r: r[0])[:4]
        rows.append("    top4: " + "; ".join(f"{100 * floor / t:.1f}% {c}" for t, c in top))
        print(rows[-1], flush=True)
        del xs, ref
        torch.cuda.empty_cache()

if only in ("all", "linear"):
    for (N, K), T in itertools.product(LINEAR_SHAPES, LINEAR_TOKENS):
        nbytes = linear_bytes(T, N, K)
        floor = nbytes / bw * 1e3
        xs = [make_linear_inputs(T, N, K, torch.bfloat16, torch.device("cuda"), bias=False)
              for _ in range(sets_for(nbytes))]
        ys = [torch.empty(T, N, dtype=torch.bfloat16, device="cuda") for _ in xs]
        plan = linear_plan(T, N, K // 2, torch.device("cuda"))
        x0 = xs[0]

        def call(x, y, cfg):
            s8, gs = x["scales"].view(torch.uint8), x["gs"].reshape(1)
            return lambda: linear_launch(x["x"], x["packed"], s8, gs, None, y, cfg=cfg)

        call(x0, ys[0], plan)()
        err = rel_err(ys[0], nvfp4_linear_ref(x0["x"], x0["packed"], x0["scales"], x0["gs"]))
        cfgs = [plan]
        for BN, BKH, nw, ns in [(32, 128, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2), (64, 256, 8, 2), (32, 256, 4, 3),
                                (64, 128, 4, 1), (16, 256, 4, 2)]:
            tiles = -(-N // BN)
            split = max(1, min(-(-264 // tiles), K // 2 // BKH))
            cfgs.append(dict(BN=BN, BKH=BKH, num_warps=nw, split=split, num_stages=ns))
        res = []
        for cfg in cfgs:
            ms = timed([call(x, y, cfg) for x, y in zip(xs, ys)])
            res.append((ms, cfg))
            print(f"  linear T={T} N={N} K={K} {cfg} {ms * 1e3:.2f} us {100 * floor / ms:.1f}%", flush=True)
        best = min(res, key=lambda r: r[0])
        rows.append(f"linear T={T} N={N} K={K} floor {floor * 1e3:.2f}us err {err:.1e} | plan {res[0][0] * 1e3:.2f}us "
                    f"{100 * floor / res[0][0]:.1f}% | best {best[0] * 1e3:.2f}us {100 * floor / best[0]:.1f}% "
                    f"{best[1]}")
        print(rows[-1], flush=True)
        del xs, ys
        torch.cuda.empty_cache()

print("\n".join(rows))
