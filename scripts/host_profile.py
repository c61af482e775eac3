"""Where an eager call's host time goes: per op, a cProfile of back-to-back calls (top functions by own time), and
the unit costs of the pieces (torch.empty, a Triton launch by argument count, a torch.library custom op).

    python scripts/host_profile.py [--calls 300] [--top 14] [--no-profile] [op ...]     (GPU machine)
"""
import argparse
import cProfile
import pstats
import time

import torch

from llmkernels.bench.eager import benches  # before triton (on a CPU, llmkernels sets up the interpreter first)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def split_us(fn, calls=300):
    """(host us per call with the GPU busy elsewhere, GPU us per call: events around back-to-back calls, wall us per
    call of those)."""
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    e0.record()
    for _ in range(calls):
        fn()
    e1.record()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    # host alone: a short loop queued behind a ~50 ms GPU sleep, so no launch waits for the GPU (few calls: a
    # full launch queue, ~1000 kernels, would block the host on the GPU again)
    n = min(calls, 64)
    torch.cuda._sleep(100_000_000)
    t3 = time.perf_counter()
    for _ in range(n):
        fn()
    t4 = time.perf_counter()
    torch.cuda.synchronize()
    return (t4 - t3) * 1e6 / n, e0.elapsed_time(e1) * 1e3 / calls, (t2 - t0) * 1e6 / calls


def per_call_us(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


@triton.jit
def _k4(a, b, n, m, BLOCK: tl.constexpr):
    pass


@triton.jit
def _k24(a, b, c, d, e, f, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17,
         BLOCK: tl.constexpr, F1: tl.constexpr, F2: tl.constexpr):
    pass


@torch.library.custom_op("hostprobe::alloc", mutates_args=())
def _alloc_op(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@_alloc_op.register_fake
def _(x):
    return torch.empty_like(x)


def units():
    x = torch.empty(1024, device="cuda")
    ints = list(range(3, 21))
    rows = [
        ("torch.empty(1024)", lambda: torch.empty(1024, device="cuda")),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("triton launch, 4 args", lambda: _k4[(1,)](x, x, 5, 7, BLOCK=16)),
        ("triton launch, 24 args + 3 constexpr", lambda: _k24[(1,)](x, x, x, x, x, x, *ints, BLOCK=16, F1=True,
                                                                    F2=False)),
        ("custom op returning empty_like", lambda: _alloc_op(x)),
        ("same body, plain call", lambda: torch.empty_like(x)),
        ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream()),
        ("x.stride(), x.shape, x.dtype", lambda: (x.stride(), x.shape, x.dtype)),
    ]
    print("\nunit costs (us per call)")
    for name, fn in rows:
        print(f"  {name:<42} {per_call_us(fn):7.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ops", nargs="*")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--no-profile", action="store_true", help="host / GPU / wall split only")
    ap.add_argument("--peers", action="store_true", help="the host / GPU / wall split of the available peers too")
    ap.add_argument("--no-units", action="store_true", help="skip the unit costs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_profile.py needs a CUDA GPU")
    for b in benches(args.ops or None):
        impl = next(i for i in b.impls if i.name == "llmkernels-eager")
        for case in b.cases(False):
            x = case.make_inputs()
            fn = impl.build(x)
            host, gpu, wall = split_us(fn, args.calls)
            print(f"\n=== {b.op} {case.shape}: host {host:.1f} us, GPU {gpu:.1f} us, wall {wall:.1f} us per call")
            for peer in (b.impls if args.peers else []):
                if peer is impl or peer.available() is not None:
                    continue
                ph, pg, pw = split_us(peer.build(x), args.calls)
                print(f"    {peer.name:<22} host {ph:.1f} us, GPU {pg:.1f} us, wall {pw:.1f} us per call")
            if args.no_profile:
                continue
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(args.calls):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            st = pstats.Stats(pr)
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
            for (file, line, func), (cc, nc, tt, ct, _) in rows:
                print(f"  {tt * 1e6 / args.calls:7.1f} us own {ct * 1e6 / args.calls:7.1f} cum  x{nc // args.calls:<3}"
                      f" {file.split('site-packages/')[-1].split('llmkernels/')[-1]}:{line} {func}")
    if not args.no_units:
        units()


if __name__ == "__main__":
    main()
