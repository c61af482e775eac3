"""Time our kernels and their peers on one device and turn the times into records."""
import datetime
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import triton

from .ceilings import copy_bandwidth, gemm_rate, memory_floor_ms, read_bandwidth, write_bandwidth


@dataclass
class Impl:
    """One implementation of an op: ours ("llmkernels") or a peer.

    build(inputs) returns a zero-argument callable that runs the op once on those inputs.
    available() returns None when the implementation can run here, else the reason it is skipped.
    """
    name: str
    build: Callable[[dict], Callable[[], object]]
    available: Callable[[], Optional[str]] = lambda: None
    max_bytes: Optional[int] = None  # skip cases larger than this (e.g. an eager peer that would run out of memory)


@dataclass
class Case:
    """One benchmark shape. bytes/flops are the least traffic/arithmetic any implementation needs."""
    shape: dict
    make_inputs: Callable[[], dict]
    bytes: int
    flops: Optional[int] = None
    # "memory": floor = (bytes - write_bytes) at the read rate + write_bytes at the write rate; "compute": flops at
    # the GEMM rate; "latency": the memory floor is recorded but is nanoseconds (reports show no % of it)
    bound: str = "memory"
    # "do_bench" (L2 flushed by triton before each rep), "graph" (rotated inputs, CUDA-graph replay) or "eager"
    # (wall time per call of back-to-back eager calls: what a caller outside a graph pays, host included)
    timing: str = "do_bench"
    write_bytes: int = 0  # of `bytes`, those the op writes (its outputs); the rest it reads


@dataclass
class OpBench:
    op: str
    cases: Callable[[bool], List[Case]]  # cases(quick) -> the shapes; quick=True gives a short list
    impls: List[Impl] = field(default_factory=list)


def _git_commit() -> str:
    """The commit measured: $LLMKERNELS_COMMIT (set it where the tree travels without .git), else git's HEAD."""
    if os.environ.get("LLMKERNELS_COMMIT"):
        return os.environ["LLMKERNELS_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "unknown"


def median_ms(fn: Callable[[], object], reps: int, device: torch.device, warm: int = 1) -> float:
    """Median ms of fn() over reps calls after warm ones, each timed alone (CUDA events around it; the CPU's clock
    elsewhere): for calls long enough that a launch's host cost does not matter (model blocks, whole steps)."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _capture(fns: List[Callable[[], object]], calls: int) -> "torch.cuda.CUDAGraph":
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fns[j % len(fns)]()
    return graph


def _replay_ms(graph, reps: int) -> float:
    """Median time of one replay (after 3 unmeasured ones)."""
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _graph_time_ms(fns: List[Callable[[], object]], calls: Optional[int] = None, reps: int = 20,
                   target_ms: float = 5.0, max_calls: int = 1024) -> float:
    """Median time per call of `calls` back-to-back launches replayed from one CUDA graph.

    A replay costs a fixed ~20-40 us beyond its calls (graph launch, the first call's start, the last one's tail), so
    calls defaults to enough launches for ~target_ms a replay (at most max_calls, a multiple of len(fns)), sized from a
    short graph of the same calls. (Sizing it from one eager call, whose time includes the host's launch overhead,
    gave replays of 5-40 calls for 10-25 us kernels and read nvfp4_gemv 5-45 points low: notes/nvfp4_gemv.md, round 11.)
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compile, autotune) outside the capture
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if calls is None:
        n0 = len(fns) * max(1, -(-16 // len(fns)))
        per_call = _replay_ms(_capture(fns, n0), 5) / n0
        calls = min(max_calls, max(1, math.ceil(target_ms / max(per_call, 1e-4))))
        calls = len(fns) * max(1, -(-calls // len(fns)))
    return _replay_ms(_capture(fns, calls), reps) / calls


def rotation_sets(nbytes: int) -> int:
    """How many input sets a graph-timed case rotates through: more than 3x the L2 in all, so every call is L2-cold,
    and at least 3, so a figure averages over 3 placements of the inputs in DRAM (one allocation can run ~2 % faster
    or slower than another: notes/masked_decode.md); at most 64."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return min(max(3, math.ceil(3 * l2 / max(nbytes, 1))), 64)


def _eager_ms(fn: Callable[[], object], calls: int = 300, rounds: int = 5) -> float:
    """Median over rounds of the wall time per call of `calls` back-to-back eager calls (synchronised at both ends)."""
    return eager_interleaved([fn], calls, rounds)[0]


def eager_interleaved(fns, calls: int = 300, rounds: int = 7, raw: bool = False, warmup: int = 20) -> List:
    """_eager_ms of several implementations of one case, their rounds interleaved (A B C A B C ...), so that they
    share the GPU's clock and power state and the host's: a round of 300 calls lasts ~10 ms, and runs apart by
    seconds differed by up to 1.5x for the same call (benchmarks/notes/host_path.md). raw: every round's time."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3 / calls)
    return times if raw else [sorted(ts)[rounds // 2] for ts in times]


EAGER_PASSES, EAGER_ROUNDS = 7, 3


def _available(bench: OpBench, log) -> list:
    """The implementations of bench that can run here; each skipped one is logged with its reason."""
    impls = []
    for impl in bench.impls:
        reason = impl.available()
        if reason:
            log(f"[{bench.op}] skipping peer {impl.name}: {reason}")
        else:
            impls.append(impl)
    return impls


def run_eager(benches, passes: int = EAGER_PASSES, log=print, progress: Optional["Progress"] = None) -> List[dict]:
    """Eager records of every case of benches: all cases built first, then `passes` passes through all of them, each
    timing a case's implementations in EAGER_ROUNDS interleaved rounds; ms = the median of a case's rounds over all
    passes, and pass_ms each pass's median. A pass over every op lasts seconds, so the rounds sample the host's
    speed over a minute rather than one burst: on the GPU machine's virtual CPUs the same call read 1.3-2x apart
    between bursts and between processes (benchmarks/notes/host_path.md, version 4)."""
    built = []  # (op, case, [(impl, fn)])
    for bench in benches:
        impls = _available(bench, log)
        for case in bench.cases(False):
            fns = []
            for impl in impls:
                try:
                    fn = impl.build(case.make_inputs())
                    fn()
                    torch.cuda.synchronize()
                    fns.append((impl, fn))
                except Exception as e:  # a peer failing must not stop the run
                    log(f"\n[{bench.op}] {impl.name} failed at {case.shape}: {type(e).__name__}: {str(e)[:200]}")
                    torch.cuda.synchronize()
            built.append((bench.op, case, fns))
    rounds = {(i, j): [] for i, (_, _, fns) in enumerate(built) for j in range(len(fns))}
    per_pass = {k: [] for k in rounds}
    for p in range(passes):
        for i, (op, case, fns) in enumerate(built):
            ts = eager_interleaved([fn for _, fn in fns], rounds=EAGER_ROUNDS, raw=True, warmup=20 if p == 0 else 3)
            for j, t in enumerate(ts):
                rounds[(i, j)] += t
                per_pass[(i, j)].append(sorted(t)[len(t) // 2])
        if progress:
            progress.step(f"eager pass {p + 1}/{passes}")
    # the ceilings after the timing (a copy or GEMM burst changes the clocks): the report tells runs apart by them
    copy_tbps, gemm_tflops = copy_bandwidth() / 1e12, gemm_rate() / 1e12
    device, date, commit = torch.cuda.get_device_name(), datetime.date.today().isoformat(), _git_commit()
    records = []
    for i, (op, case, fns) in enumerate(built):
        for j, (impl, _) in enumerate(fns):
            ts = sorted(rounds[(i, j)])
            ms = ts[len(ts) // 2]
            log(f"\n[{op}] {impl.name} {case.shape}: {ms:.4f} ms")
            records.append({
                "op": op, "impl": impl.name, "shape": case.shape, "ms": ms, "floor_ms": 0.0, "pct_of_floor": 0.0,
                "tflops": None, "gbps": 0.0, "bound": case.bound, "timing": "eager",
                "rounds": len(ts), "pass_ms": per_pass[(i, j)], "copy_tbps": copy_tbps, "gemm_tflops": gemm_tflops,
                "device": device, "torch": torch.__version__,
                "triton": triton.__version__, "date": date, "commit": commit,
            })
    return records


def time_impl(impl: Impl, case: Case) -> tuple:
    """Returns (ms, timing mode actually used)."""
    if case.timing == "eager":
        return _eager_ms(impl.build(case.make_inputs())), "eager"
    if case.timing == "graph":
        sets = rotation_sets(case.bytes)
        fns = [impl.build(case.make_inputs()) for _ in range(sets)]
        try:
            return _graph_time_ms(fns), "graph"
        except Exception:  # some peers cannot be captured; fall back to flushed do_bench
            torch.cuda.synchronize()
            fns = fns[:1]
    else:
        fns = [impl.build(case.make_inputs())]
    fn = fns[0]
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"), "do_bench"


class Progress:
    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = max(total, 1), 0, stream

    def step(self, label: str) -> None:
        self.done += 1
        width = 30
        filled = int(width * self.done / self.total)
        self.stream.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total} {label[:60]:<60}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def run_op_bench(bench: OpBench, quick: bool = False, log=print, progress: Optional[Progress] = None) -> List[dict]:
    # the copy rate first; the bf16 GEMM ceiling only after the cases: it runs at the power cap and leaves the
    # GPU slow for seconds (nvfp4_gemv read 9-18 points low right after it: benchmarks/notes/nvfp4_gemv.md, round 8)
    cases = bench.cases(quick)
    if cases and all(c.timing == "eager" for c in cases):
        return run_eager([bench], log=log, progress=progress)
    copy_tbps = copy_bandwidth() / 1e12
    read_bps, write_bps = read_bandwidth(), write_bandwidth()
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = _git_commit()
    records, timed = [], []
    impls = _available(bench, log)
    for case in cases:
        for impl in impls:
            label = f"{bench.op} {impl.name} " + " ".join(f"{k}={v}" for k, v in case.shape.items())
            if impl.max_bytes is not None and case.bytes > impl.max_bytes:
                log(f"\n[{bench.op}] skipping {impl.name} at {case.shape}: input too large for this peer")
                if progress:
                    progress.step(label)
                continue
            try:
                ms, mode = time_impl(impl, case)
            except Exception as e:  # a peer failing must not stop the run
                log(f"\n[{bench.op}] {impl.name} failed at {case.shape}: {type(e).__name__}: {str(e)[:200]}")
                torch.cuda.synchronize()
                if progress:
                    progress.step(label)
                continue
            finally:
                torch.cuda.empty_cache()
            timed.append((case, impl, ms, mode))
            log(f"\n[{bench.op}] {impl.name} {case.shape}: {ms:.4f} ms")
            if progress:
                progress.step(label)
    fresh = gemm_rate.cache_info().currsize == 0
    gemm_tflops = gemm_rate() / 1e12
    if fresh:  # let the GPU recover before whatever is timed next (another op of the same run)
        time.sleep(5)
    for case, impl, ms, mode in timed:
        if case.bound == "compute":
            floor_ms = case.flops / (gemm_tflops * 1e12) * 1e3
        else:
            floor_ms = memory_floor_ms(case.bytes - case.write_bytes, case.write_bytes, read_bps, write_bps)
        records.append({
            "op": bench.op, "impl": impl.name, "shape": case.shape, "ms": ms, "floor_ms": floor_ms,
            "pct_of_floor": 100.0 * floor_ms / ms,
            "tflops": (case.flops / (ms * 1e-3) / 1e12) if case.flops else None,
            "gbps": case.bytes / (ms * 1e-3) / 1e9, "bound": case.bound, "timing": mode,
            "copy_tbps": copy_tbps, "read_tbps": read_bps / 1e12, "write_tbps": write_bps / 1e12,
            "gemm_tflops": gemm_tflops, "device": device, "torch": torch.__version__, "triton": triton.__version__,
            "date": date, "commit": commit,
        })
    return records


def merge_records(path, new: List[dict]) -> List[dict]:
    """Replace records of the same (op, impl, shape) in the JSON file at path (in place; others appended) and write
    it back."""
    key = lambda r: (r["op"], r["impl"], json.dumps(r["shape"], sort_keys=True))  # noqa: E731
    try:
        with open(path) as f:
            old = json.load(f).get("records", [])
    except FileNotFoundError:
        old = []
    fresh = {key(r): r for r in new}  # a replaced record keeps its place (the report's tables follow the file)
    merged = [fresh.pop(key(r), r) for r in old] + list(fresh.values())
    with open(path, "w") as f:
        json.dump({"records": merged}, f, indent=1)
    return merged
