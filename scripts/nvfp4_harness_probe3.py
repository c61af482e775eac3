"""Why does `llmkernels bench nvfp4_gemv` read below the sweeps on the same machine (notes, round 11)?
Found: the harness sized its replays from one eager call (host launch overhead included), so a replay
held 5-40 calls and its fixed ~10 us cost read as the kernel's; fixed in _graph_time_ms. Runs the harness's own run_op_bench on the three contest shapes (ours and static only, no peers) three times in one
process, then the sweep's way (gemv_launch, one input allocation per shape, 32 calls a graph) and the harness's
time_impl again; prints % of floor per pass."""
import torch

from llmkernels.bench import OpBench
from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets, run_op_bench, time_impl
from llmkernels.ops.nvfp4_gemv import spec
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch, gemv_plan

bw = copy_bandwidth()
impls = [i for i in spec.benches()[0].impls if i.name.startswith("llmkernels")]
bench = OpBench("nvfp4_gemv", spec._gemv_cases, impls)
for rnd in range(3):
    recs = run_op_bench(bench, quick=True, log=lambda m: None)
    print(f"harness pass {rnd}: " + "  ".join(f"{r['impl'][11:] or 'default'} {r['shape']['M']}x{r['shape']['K']}x"
                                             f"{r['shape']['L']} {r['pct_of_floor']:.1f}" for r in recs), flush=True)
for M, K, L in spec.GEMV_SHAPES[:3]:
    nbytes = spec.gemv_bytes(M, K, L)
    floor_ms = nbytes / bw * 1e3
    sets = rotation_sets(nbytes)
    xs = [spec.make_inputs(M, K, L, torch.device("cuda")) for _ in range(sets)]
    u8 = lambda x: [x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")]  # noqa: E731
    out = []
    for sw in (False, True):
        cfg = gemv_plan(M, K // 16, L, torch.device("cuda"), sw)
        fns = [lambda x=x, cfg=cfg: gemv_launch(*u8(x), x["c"], 1.0, cfg=cfg) for x in xs]
        ops = [spec._gemv_ours_static(x) if sw else spec._gemv_ours(x) for x in xs]
        case = [c for c in spec._gemv_cases(True) if c.shape == {"M": M, "K": K, "L": L}][0]
        for name, f in (("raw32", lambda: _graph_time_ms(fns, calls=32, reps=15)),
                        ("raw64", lambda: _graph_time_ms(fns, calls=64)),
                        ("raw256", lambda: _graph_time_ms(fns, calls=256)),
                        ("raw1024", lambda: _graph_time_ms(fns, calls=1024)),
                        ("op64", lambda: _graph_time_ms(ops, calls=64)),
                        ("opauto", lambda: _graph_time_ms(ops)),
                        ("time_impl", lambda: time_impl(impls[int(sw)], case)[0])):
            out.append(f"{'static' if sw else 'default'} {name} {100 * floor_ms / f():.1f}")
    print(f"{M}x{K}x{L}: " + "  ".join(out), flush=True)
    del xs
    torch.cuda.empty_cache()
recs = run_op_bench(bench, quick=True, log=lambda m: None)
print("harness again: " + "  ".join(f"{r['impl'][11:] or 'default'} {r['shape']['M']}x{r['shape']['K']}x{r['shape']['L']} "
                                    f"{r['pct_of_floor']:.1f}" for r in recs), flush=True)
