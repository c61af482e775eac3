"""Command line: `llmkernels info | check [op ...] | bench [op ...]`, `llmkernels --version`."""
import argparse
import os
import sys

import torch

from . import __version__


def _info(args) -> int:
    import triton

    from ._versions import untested
    print(f"llmkernels {__version__}, torch {torch.__version__}, triton {triton.__version__}")
    for w in untested({"torch": torch.__version__, "triton": triton.__version__}):
        print(f"warning: untested version: {w}; see the README's supported versions", file=sys.stderr)
    if not torch.cuda.is_available():
        print("device: CPU only (kernels run through the Triton interpreter; no ceilings to measure)")
        return 0
    from .bench.ceilings import ceilings
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, "
          f"L2 {p.L2_cache_size / 2**20:.0f} MiB, capability {p.major}.{p.minor}")
    c = ceilings()
    print(f"memory: copy (read+write) {c['copy_tbps']:.2f} TB/s, read {c['read_tbps']:.2f} TB/s, write "
          f"{c['write_tbps']:.2f} TB/s; bf16 GEMM: {c['gemm_tflops']:.0f} TFLOP/s")
    return 0


def _check(args) -> int:
    import warnings

    from ._runtime import default_device
    from .registry import spec_modules
    # the interpreter evaluates both sides of tl.where, so masked lanes divide by zero harmlessly
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    device = default_device()
    print(f"checking on {device} ({'Triton interpreter' if device.type == 'cpu' else torch.cuda.get_device_name()})")
    results = []
    for mod in spec_modules(args.ops):
        try:
            results += mod.check(device)
        except Exception as e:  # an op that raises fails its check, the others still run
            from .checking import CheckResult
            results.append(CheckResult(mod.__name__.split(".")[-2], "raised", False, float("inf"), 0,
                                       f"{type(e).__name__}: {e}"))
    w = max(len(r.case) for r in results)
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.op:<24} {r.case:<{w}}  err {r.err:.2e}  tol {r.tol:.1e}  {r.note}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _bench(args) -> int:
    if not torch.cuda.is_available():
        print("llmkernels bench needs a CUDA GPU; none is present here", file=sys.stderr)
        return 2
    from .bench.harness import EAGER_PASSES, Progress, merge_records, run_eager, run_op_bench
    from .bench.report import device_slug, plot, table
    from .registry import bench_modules, resolve
    ops = resolve(args.ops)
    if args.eager:
        from .bench.eager import benches as eager_benches
        benches = eager_benches(ops)
    else:
        benches = [b for mod in bench_modules(ops) for b in mod.benches() if b.op in ops]
    if args.impls:
        wanted = set(args.impls.split(","))
        unknown = wanted - {i.name for b in benches for i in b.impls}
        if unknown:
            print(f"--impls: no implementation named {', '.join(sorted(unknown))} in the chosen benches (names: "
                  f"{', '.join(sorted({i.name for b in benches for i in b.impls}))})", file=sys.stderr)
            return 2
        for b in benches:
            b.impls = [i for i in b.impls if i.name in wanted]
        benches = [b for b in benches if b.impls]
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if args.eager:  # every op's cases in each pass (see run_eager)
        records = run_eager(benches, log=log, progress=Progress(EAGER_PASSES))
    else:
        progress = Progress(sum(len(b.cases(args.quick)) * len(b.impls) for b in benches))
        records = []
        for b in benches:
            records += run_op_bench(b, quick=args.quick, log=log, progress=progress)
    print(table(records))
    os.makedirs(args.out, exist_ok=True)
    slug = device_slug(torch.cuda.get_device_name())
    path = os.path.join(args.out, f"{slug}.json")
    merged = merge_records(path, records)
    print(f"records: {path} ({len(records)} new, {len(merged)} in file)")
    png = os.path.join(args.out, f"{slug}.png")
    if plot(merged, png):
        print(f"plot: {png}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="llmkernels", description=__doc__)
    ap.add_argument("--version", action="version", version=f"llmkernels {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="{info,check,bench}")
    sub.add_parser("info", help="device, versions and the measured copy / read / write / GEMM ceilings")
    from .registry import ALIASES, SPECS
    ops_help = (f"op names (none: all): {', '.join(SPECS)}; or the public functions they cover: "
                f"{', '.join(ALIASES)}")
    c = sub.add_parser("check", help="every op vs its fp32 reference on the present device (exit 1 on a failure)")
    c.add_argument("ops", nargs="*", metavar="op", help=ops_help)
    b = sub.add_parser("bench", help="time ops and peers; print a table, write JSON records and a PNG plot")
    b.add_argument("ops", nargs="*", metavar="op", help=ops_help)
    b.add_argument("--out", default="benchmarks/results", help="folder for <device>.json and <device>.png")
    b.add_argument("--quick", action="store_true", help="a few shapes only")
    b.add_argument("--impls", default=None, help="comma-separated implementations to time (default: all), e.g. "
                   "llmkernels to re-record ours without the peers")
    b.add_argument("--eager", action="store_true",
                   help="wall time per call of back-to-back eager calls at a small shape (host cost), with peers: "
                        "the median of 3 interleaved rounds of 300 calls in each of 7 passes over all ops")
    args = ap.parse_args(argv)
    if args.cmd is None:  # a bare `llmkernels`: the help, as a usage error
        ap.print_help()
        return 2
    if args.cmd in ("check", "bench"):
        from .registry import resolve
        try:
            resolve(args.ops)
        except ValueError as e:
            (c if args.cmd == "check" else b).error(str(e))  # exits 2, the usage-error code
    return {"info": _info, "check": _check, "bench": _bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
