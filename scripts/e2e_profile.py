"""Where a whole-model decode step's GPU time goes: one eager step of a random-weight model shape
(llmkernels.hf.bench's) under torch.profiler, kernel time and count by kind, the heaviest kernels, then the CUDA-graph
step time. GPU machine."""
import argparse
import collections
import sys

import torch

KINDS = (("tiled_mma", "nvfp4 linear"), ("_linear", "nvfp4 linear"), ("masked_decode", "attention"),
         ("nvjet", "cublas"), ("gemm", "cublas"), ("splitkreduce", "cublas"), ("triton_", "inductor (fused)"),
         ("reduce", "reductions"), ("cat", "copy / cat"), ("copy", "copy / cat"), ("index", "index / scatter"),
         ("elementwise", "elementwise"))


def kind(name: str) -> str:
    n = name.lower()
    return next((k for key, k in KINDS if key in n), "other")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/e2e_profile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b-shaped")
    ap.add_argument("--format", choices=("bf16", "nvfp4"), default="nvfp4")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--compile", nargs="?", const="inductor", default=None, help="the decode step under torch.compile")
    ap.add_argument("--top", type=int, default=12, help="kernels listed by total time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("e2e_profile.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from torch.profiler import ProfilerActivity, profile
    from llmkernels.hf.bench import DIRECT_NVFP4, build
    from llmkernels.hf.decode import StaticDecoder
    from llmkernels.hf.save import quantize_
    dev = torch.device("cuda")
    direct = args.format == "nvfp4" and args.model in DIRECT_NVFP4
    model = build(args.model, dev, torch.bfloat16, direct_nvfp4=direct)
    if args.format == "nvfp4" and not direct:
        quantize_(model)
    dec = StaticDecoder(model, args.batch, args.prompt_len + 64, graph=False, compile=args.compile or False)
    dec.prefill(torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len), device=dev))
    for _ in range(3):  # (compiles on the first, with --compile)
        dec.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.step()
        torch.cuda.synchronize()
    by, names = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            for d, k in ((by, kind(e.name)), (names, e.name[:100])):
                d[k][0] += e.device_time
                d[k][1] += 1
    total, count = sum(v[0] for v in by.values()), sum(v[1] for v in by.values())
    print(f"{args.model} {args.format} batch {args.batch} compile {args.compile}: eager step, "
          f"{total / 1e3:.2f} ms of kernels in {count}")
    for k, (t, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"  {k:18s} {t / 1e3:7.3f} ms {n:6d} kernels {t / n:7.1f} us each")
    for k, (t, n) in sorted(names.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"    {t / 1e3:7.3f} ms {n:5d}  {k}")
    dec.graph = True
    for _ in range(2):  # the first captures the graph
        dec.step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(30):
        dec.step()
    end.record()
    end.synchronize()
    print(f"  CUDA-graph step: {start.elapsed_time(end) / 30:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
