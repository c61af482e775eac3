"""cp_decode benchmark: context_parallel_decode on the ranks of a torchrun job against the same code on one GPU.

    torchrun --standalone --nproc-per-node 2 -m llmkernels.distributed.bench --out DIR   # world 1 and 2
    python -m llmkernels.distributed.bench --out DIR                                      # world 1 only
    torchrun --standalone --nproc-per-node 2 -m llmkernels.distributed.bench --tiny --out DIR  # CPU, gloo

Every figure is a CUDA-graph replay of many back-to-back decode steps (kernels, collective and merge in one graph),
per step (replays of 2n and n steps, the difference over n: a replay's fixed cost and the ranks' launch skew cancel);
the max over the ranks. The world-1 baseline runs on rank 0 in the same job while
the other ranks wait. With world > 1 the step is also timed without its exchange (decode only: local lengths and
masked_decode into the rank's slot) and the exchange alone (the in-place all-gather and the merge), and one graph
with %globaltimer stamps around each step's decode and exchange gives, per step, the exchange's own cost inside the
step (the tail of the rank that waits least, less a stamp) and how long the faster rank waits. No input
rotation: each rank's shard is >= 0.5 GB, 10x the 50 MB L2, so every step streams its shard from DRAM (q, 128 KB at
B 8, may stay in L2 in both worlds). NCCL's NVLink multicast (NVLS) is off: NCCL_NVLS_ENABLE=0 unless set, before
NCCL starts (the device docs: keep it off). Records (the harness's format) go to DIR/cp_decode.json and, merged
into a copy of the committed records of the device, DIR/<device>.json.
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before torch.distributed starts NCCL

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..bench.ceilings import memory_floor_ms  # noqa: E402
from ..bench.harness import _git_commit, _graph_time_ms, merge_records  # noqa: E402
from ..bench.report import device_slug  # noqa: E402
from ._comm import exchange_buffer, exchange_merge, part_views  # noqa: E402
from .decode import context_parallel_decode, cp_decode_setup  # noqa: E402

FULL = dict(dtype=torch.bfloat16, hkv=8, hq=64, d=128,
            cases=[(1, 1 << 18), (8, 1 << 18), (1, 1 << 20), (8, 1 << 20)], big=[(8, 1 << 22)])
TINY = dict(dtype=torch.float16, hkv=2, hq=4, d=64, cases=[(1, 64), (2, 96)], big=[(2, 128)])
TARGET_MS = 25.0  # replay length (the ranks' launch skew, ~0.1 ms a replay, cancels in _graph_ms's 2n - n difference)


def _graph_ms(fn, steps: int, reps: int = 10) -> float:
    """Time per step: replays of 2 * steps and of steps calls from CUDA graphs, the difference over steps (every rank
    captures the same collectives). A replay's fixed costs cancel, the ranks' launch skew among them: each process
    starts its replay when its host gets there, and the first all-gather waits for the later one (about 0.1 ms a
    replay, which read 28-41 us a step too high at the 2-5 steps a replay of the largest caches)."""
    one = _graph_time_ms([fn], calls=steps, reps=reps) * steps
    return (_graph_time_ms([fn], calls=2 * steps, reps=reps) * 2 * steps - one) / steps


@triton.jit
def _stamp_kernel(p, i):
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(p + i, t)


def _timeline(fill, exchange, steps: int, dev) -> dict:
    """Per-step %globaltimer stamps in one graph: A, fill, B, exchange (all-gather + merge), C. Stamps are compared
    within a rank only. Returns this rank's decode (B - A) and tail (C - B) per step in ns, and a stamp's cost."""
    ts = torch.zeros(3 * steps, dtype=torch.int64, device=dev)

    def stamp(i):
        _stamp_kernel[(1,)](ts, i, num_warps=1)

    def body(n):
        for i in range(n):
            stamp(3 * i)
            fill()
            stamp(3 * i + 1)
            exchange()
            stamp(3 * i + 2)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body(1)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body(steps)
    dec, tail = [], []
    for rep in range(4):
        g.replay()
        t = ts.tolist()  # synchronises
        if rep:  # the first replay warms; the first step of each waits for the later rank's launch
            dec += [t[3 * i + 1] - t[3 * i] for i in range(1, steps)]
            tail += [t[3 * i + 2] - t[3 * i + 1] for i in range(1, steps)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(3 * steps):
            stamp(i)
    g.replay()
    t = ts.tolist()
    return {"dec": dec, "tail": tail, "stamp": sorted(t[i + 1] - t[i] for i in range(3 * steps - 1))[3 * steps // 2]}


def _eager_ms(fn, steps: int) -> float:
    """CPU (--tiny): wall time per call; only the script's path is tested there, not its speed."""
    fn()
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) * 1e3 / steps


def _steps(nbytes: int, gpu: bool) -> int:
    """Calls per graph for ~TARGET_MS, from the bytes each rank streams (2.5 TB/s) plus ~15 us; the same number
    on every rank (their graphs must issue the same collectives)."""
    if not gpu:
        return 2
    return max(8, min(500, math.ceil(TARGET_MS / (nbytes / 2.5e9 + 0.015))))


def _measure(cfg, B, L, group, rank, world, dev, cpu_group) -> dict:
    """This rank's times (ms) for one case: the step; with world > 1 also decode_only and comm_merge, and the step
    and comm_merge with the parts exchanged in the cache dtype (exchange_dtype, "_lowp")."""
    gpu = dev.type == "cuda"
    Lr = L // world
    cache = torch.empty(2, B, cfg["hkv"], Lr, cfg["d"], dtype=cfg["dtype"], device=dev)
    cache.normal_()
    q = torch.randn(B, cfg["hq"], cfg["d"], dtype=cfg["dtype"], device=dev)
    kv_len = torch.full((B,), L, dtype=torch.int32, device=dev)  # the global lengths a server keeps

    def step(xdt=None):
        return context_parallel_decode(q, cache[0], cache[1], kv_len=kv_len, group=group, exchange_dtype=xdt)

    step()  # first call: the cross-rank check, Triton compiles, the NCCL communicator
    n = _steps(cache.numel() * cache.element_size(), gpu)
    timer = (lambda fn, k: _graph_ms(fn, k)) if gpu else _eager_ms
    res = {"step": timer(step, n), "steps": n}
    if world == 1:
        return res
    R, d = B * cfg["hq"], cfg["d"]
    for tag, xdt in (("", torch.float32), ("_lowp", cfg["dtype"])):
        st = cp_decode_setup(q, cache[0], cache[1], kv_len=kv_len, group=group, exchange_dtype=xdt)
        buf = exchange_buffer(world, R, d, xdt, dev)
        outs, lses = part_views(buf, R, d, xdt)
        mine_o, mine_l = outs[rank].view(B, cfg["hq"], d), lses[rank].view(B, cfg["hq"])
        st.fill(mine_o, mine_l)
        if tag:
            step(xdt)
            res["step" + tag] = timer(lambda: step(xdt), n)
        else:
            res["decode_only"] = timer(lambda: st.fill(mine_o, mine_l), n)
        dist.barrier(group=cpu_group)
        res["comm_merge" + tag] = timer(lambda: exchange_merge(buf, rank, st.rows, d, cfg["dtype"], xdt, group),
                                        _steps(0, gpu))
        if gpu and not tag:
            dist.barrier(group=cpu_group)
            res["timeline"] = _timeline(lambda: st.fill(mine_o, mine_l),
                                        lambda: exchange_merge(buf, rank, st.rows, d, cfg["dtype"], xdt, group),
                                        max(n, 20), dev)
    if gpu:
        torch.cuda.synchronize()
    return res  # the cache is freed on return (main empties the allocator's cache before the next case)


def _free(gpu: bool) -> None:
    if gpu:
        torch.cuda.empty_cache()  # the next case's cache (up to 64 GiB a GPU) needs the memory back


def _max_over_ranks(res: dict, cpu_group, world: int) -> dict:
    allr = [None] * world
    dist.all_gather_object(allr, res, group=cpu_group)
    out = {k: max(r[k] for r in allr) for k in res if k != "timeline"}
    if "timeline" in res:  # per step: the rank that waits least spends its tail in the exchange itself
        tls = [r["timeline"] for r in allr]
        n, stamp = len(tls[0]["tail"]), max(tl_["stamp"] for tl_ in tls)
        tail = sorted(min(tl_["tail"][i] for tl_ in tls) - stamp for i in range(n))
        wait = sorted(max(tl_["dec"][i] for tl_ in tls) - min(tl_["dec"][i] for tl_ in tls) for i in range(n))
        out.update(in_step=tail[n // 2] * 1e-6, in_step_p90=tail[(9 * n) // 10] * 1e-6, rank_wait=wait[n // 2] * 1e-6,
                   timeline_steps=n)
    if "decode_only" in res:  # how far the ranks' decodes differ: a step's all-gather waits for the slower one
        out["decode_only_min"] = min(r["decode_only"] for r in allr)
    return out


def _record(cfg, B, L, world, t, base, dev_names, tbps, gemm_tflops, gpu) -> dict:
    """tbps: (copy, read, write) ceilings in TB/s, or None (CPU): the floor reads a rank's KV shard and q, and writes
    its out."""
    out_bytes = 2 * B * cfg["hq"] * cfg["d"]
    shard_bytes = 2 * B * cfg["hkv"] * (L // world) * cfg["d"] * 2 + 2 * out_bytes
    copy_tbps, read_tbps, write_tbps = tbps or (None, None, None)
    floor = memory_floor_ms(shard_bytes - out_bytes, out_bytes, read_tbps * 1e12, write_tbps * 1e12) if tbps else None
    r = {"op": "cp_decode", "impl": "llmkernels",
         "shape": {"B": B, "Hkv": cfg["hkv"], "Hq": cfg["hq"], "L": L, "D": cfg["d"], "world": world},
         "ms": t["step"], "floor_ms": floor, "pct_of_floor": 100.0 * floor / t["step"] if floor else None,
         "tflops": None, "gbps": shard_bytes / (t["step"] * 1e-3) / 1e9, "bound": "memory",
         "timing": "graph" if gpu else "eager-cpu", "copy_tbps": copy_tbps, "read_tbps": read_tbps,
         "write_tbps": write_tbps, "gemm_tflops": gemm_tflops,
         "device": dev_names[0], "devices": dev_names, "torch": torch.__version__, "triton": triton.__version__,
         "date": datetime.date.today().isoformat(), "commit": _git_commit(),
         "dtype": str(cfg["dtype"]).replace("torch.", ""), "graph_steps": t["steps"],
         "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
    if world > 1:
        r.update(decode_only_ms=t["decode_only"], decode_only_min_ms=t["decode_only_min"],
                 comm_merge_ms=t["comm_merge"],
                 added_ms=t["step"] - t["decode_only"], exchange_dtype="float32",
                 exchange_in_step_ms=t.get("in_step"), exchange_in_step_p90_ms=t.get("in_step_p90"),
                 rank_wait_ms=t.get("rank_wait"), timeline_steps=t.get("timeline_steps"),
                 lowp_exchange={"dtype": r["dtype"], "ms": t["step_lowp"], "comm_merge_ms": t["comm_merge_lowp"],
                                "added_ms": t["step_lowp"] - t["decode_only"]})
    if base is not None:
        r.update(world1_ms=base, vs_world1=t["step"] / base)
    return r


def _table(records) -> str:
    """One line per record; times in ms, the exchange's cost in us; "lowp": parts exchanged in the cache dtype."""
    if not records:
        return "cp_decode: no records"
    cols = [(k, lambda r, k=k: r["shape"][k]) for k in ("B", "L", "world")] + [
            ("step ms", lambda r: f"{r['ms']:.4f}"), ("x world 1", lambda r: _fmt(r.get("vs_world1"), 1, 3)),
            ("decode only ms", lambda r: _fmt(r.get("decode_only_ms"), 1, 4)),
            ("rank spread us", lambda r: _fmt(r["decode_only_ms"] - r["decode_only_min_ms"]
                                              if "decode_only_min_ms" in r else None, 1e3, 1)),
            ("added us", lambda r: _fmt(r.get("added_ms"), 1e3, 1)),
            ("comm+merge us", lambda r: _fmt(r.get("comm_merge_ms"), 1e3, 1)),
            ("in-step exchange us", lambda r: _fmt(r.get("exchange_in_step_ms"), 1e3, 1)),
            ("rank wait us", lambda r: _fmt(r.get("rank_wait_ms"), 1e3, 1)),
            ("lowp added us", lambda r: _fmt(r.get("lowp_exchange", {}).get("added_ms"), 1e3, 1)),
            ("lowp comm+merge us", lambda r: _fmt(r.get("lowp_exchange", {}).get("comm_merge_ms"), 1e3, 1)),
            ("% floor", lambda r: _fmt(r.get("pct_of_floor"), 1, 1)), ("device", lambda r: r["device"])]
    rows = [[str(c[0]) for c in cols]] + [[str(fn(r)) for _, fn in cols] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    r0, sh0 = records[0], records[0]["shape"]
    title = f"cp_decode ({r0['dtype']}, Hkv {sh0['Hkv']}, Hq {sh0['Hq']}, D {sh0['D']}; {r0['timing']} time per step)"
    return "\n".join([title] + ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows])


def _fmt(x, scale, digits) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _init(tiny: bool):
    """(rank, world, device) from torchrun's environment, or a one-process group."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = not tiny and torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if gpu else "gloo")
    return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local) if gpu else torch.device("cpu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results", help="directory for the records")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU with gloo (tests the script)")
    ap.add_argument("--max-l", type=int, default=None, help="skip cases with a longer cache")
    args = ap.parse_args(argv)
    rank, world, dev = _init(args.tiny)
    gpu = dev.type == "cuda"
    cfg = TINY if args.tiny else FULL
    cpu_group = dist.new_group(backend="gloo") if gpu else dist.group.WORLD
    solo = dist.new_group([0])  # the world-1 baseline: same function, a group of one
    name = torch.cuda.get_device_name(dev) if gpu else "cpu"
    names = [None] * world
    dist.all_gather_object(names, name, group=cpu_group)
    tbps = None
    if gpu:
        from ..bench.ceilings import copy_bandwidth, read_bandwidth, write_bandwidth
        tbps = (copy_bandwidth() / 1e12, read_bandwidth() / 1e12, write_bandwidth() / 1e12)
    cases = [c for c in cfg["cases"] if args.max_l is None or c[1] <= args.max_l]
    big = [c for c in cfg["big"] if world > 1 and (args.max_l is None or c[1] <= args.max_l)]
    timed = []  # (B, L, world, times, world-1 ms)
    for B, L in cases + big:
        base = None
        if (B, L) in cases:
            if rank == 0:
                t1 = _measure(cfg, B, L, solo, 0, 1, dev, None)
                timed.append((B, L, 1, t1, None))
                base = t1["step"]
                _free(gpu)
            dist.barrier(group=cpu_group)
        if world > 1:
            t = _max_over_ranks(_measure(cfg, B, L, dist.group.WORLD, rank, world, dev, cpu_group), cpu_group, world)
            timed.append((B, L, world, t, base))
            _free(gpu)
        if rank == 0:
            print(f"[cp_decode] B={B} L={L} done: " + ", ".join(f"world {w} {t['step']:.4f} ms"
                                                          for b, n, w, t, _ in timed if (b, n) == (B, L)), flush=True)
    gemm = None
    if gpu and rank == 0:  # after the timings: the GEMM runs at the power cap and leaves the GPU slow for seconds
        from ..bench.ceilings import gemm_rate
        gemm = gemm_rate() / 1e12
    if rank == 0:
        recs = [_record(cfg, B, L, w, t, base, names if w > 1 else names[:1], tbps, gemm, gpu)
                for B, L, w, t, base in timed]
        os.makedirs(args.out, exist_ok=True)
        merge_records(os.path.join(args.out, "cp_decode.json"), recs)
        if gpu:
            slug = device_slug(name)
            dst = os.path.join(args.out, slug + ".json")
            src = os.path.join("benchmarks", "results", slug + ".json")
            if not os.path.exists(dst) and os.path.exists(src):
                shutil.copy(src, dst)
            merge_records(dst, recs)
        print(_table(recs), flush=True)
    dist.barrier(group=cpu_group)
    if gpu:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # leave without the interpreter's teardown: gloo's worker threads can abort it (SIGABRT, "terminate called without
    # an active exception", seen on a loaded 2-core CPU after every record was written; pytorch#179291)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
