"""Speed A/B of the working tree against a base commit, interleaved in one process on the GPU.

The control of a speed A/B is the shipped code itself, timed in the same run (DEVELOPING.md): a base commit's
package is loaded beside the working tree's, and every benchmark case of the named ops is timed with both, in turn.

    python scripts/ab.py prepare REV                          # here, in a git checkout
    python scripts/ab.py run [--rounds 2] [--quick] [op ...]  # on the GPU machine, from the repo root
    python scripts/ab.py run --eager [op ...]                 # eager wall time per call (host included)

`prepare` writes REV's llmkernels/ to ab_base/llmkernels_base/ (untracked, so it travels with the working tree to the
device; do not commit it), with its custom-op namespace renamed so that both versions register their ops in one
process. `run` takes each op's benchmark cases from the working tree's spec (the base's spec where the working tree
lacks the op), times our implementations (impl names starting with "llmkernels"; no peers) from both trees with the
harness's own timing (`bench.harness.time_impl`: do_bench or graph replay as the case says), in the order base,
head, head, base per round, and prints per case the median of each side and head / base. Outputs are not compared:
run the GPU tests for that. --eager takes the cases of bench/eager.py (`llmkernels bench --eager`: back-to-back
eager calls, wall time per call), the host path's A/B. --out DIR also writes DIR/ab.json.
"""
import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_DIR = os.path.join(ROOT, "ab_base")


def _benches(registry, names):
    """A registry's benchmark modules of these ops (before bench_modules, benches() lived in the check modules)."""
    get = getattr(registry, "bench_modules", registry.spec_modules)
    return get([n for n in names if n in registry.SPECS])


def prepare(rev: str, dest: str = BASE_DIR) -> str:
    """REV's llmkernels/ as dest/llmkernels_base/ (namespace renamed); returns the resolved commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    tar = subprocess.run(["git", "archive", commit, "llmkernels"], cwd=ROOT, capture_output=True, check=True).stdout
    pkg = os.path.join(dest, "llmkernels_base")
    shutil.rmtree(pkg, ignore_errors=True)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    os.rename(os.path.join(dest, "llmkernels"), pkg)
    for d, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                src = open(p).read()
                # torch.library names ("llmkernels::op") and absolute module names in strings (registry.SPECS)
                new = re.sub(r"([\"'])llmkernels(::|\.)", r"\1llmkernels_base\2", src)
                if new != src:
                    with open(p, "w") as fh:
                        fh.write(new)
    with open(os.path.join(dest, "COMMIT"), "w") as f:
        f.write(commit + "\n")
    return commit


def _ours(mod_specs, ops, eager_benches=None):
    """{(op, impl name, shape json): (Case, Impl)} of our implementations in these spec modules (or, given, in these
    eager OpBenches)."""
    found = {}
    for b in eager_benches if eager_benches is not None else [b for mod in mod_specs for b in mod.benches()]:
        if b.op not in ops:
            continue
        for case in b.cases(QUICK[0]):
            for impl in b.impls:
                if impl.name.startswith("llmkernels"):
                    found[(b.op, impl.name, json.dumps(case.shape, sort_keys=True))] = (case, impl)
    return found


QUICK = [False]


def run(ops, rounds: int, quick: bool, out, eager: bool = False) -> int:
    import torch
    if not torch.cuda.is_available():
        print("ab.py run needs a CUDA GPU", file=sys.stderr)
        return 2
    if not os.path.isdir(os.path.join(BASE_DIR, "llmkernels_base")):
        print("no ab_base/llmkernels_base: run `python scripts/ab.py prepare REV` first", file=sys.stderr)
        return 2
    sys.path[:0] = [ROOT, BASE_DIR]
    import llmkernels  # noqa: F401
    import llmkernels_base
    from llmkernels.bench.harness import time_impl
    base_commit = open(os.path.join(BASE_DIR, "COMMIT")).read().strip()
    QUICK[0] = quick
    from llmkernels import registry
    from llmkernels_base import registry as base_registry
    names = registry.resolve(ops)
    if eager:
        from llmkernels.bench import eager as head_eager
        from llmkernels_base.bench import eager as base_eager
        names = names + (["merge_attention_states"] if "masked_decode" in names else [])
        head = _ours(None, names, head_eager.benches(names))
        base = _ours(None, names, base_eager.benches(names))
    else:
        head = _ours(_benches(registry, names), names)
        base = _ours(_benches(base_registry, names), names)
    print(f"{torch.cuda.get_device_name()}; base {base_commit} ({llmkernels_base.__file__}), head: working tree; "
          f"{rounds} rounds of base, head, head, base", flush=True)
    rows = []
    for key in head:
        case = head[key][0]
        if key not in base:
            print(f"{key[0]} {key[1]} {case.shape}: not in the base's spec, skipped")
            continue
        sides = {"base": base[key], "head": head[key]}  # each side's own case (inputs) and implementation
        times = {"base": [], "head": []}
        try:
            for _ in range(rounds):
                for side in ("base", "head", "head", "base"):
                    c, impl = sides[side]
                    times[side].append(time_impl(impl, c)[0])
                    torch.cuda.empty_cache()
        except Exception as e:  # one case failing must not stop the others
            print(f"{key[0]} {key[1]} {case.shape}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        b, h = statistics.median(times["base"]), statistics.median(times["head"])
        rows.append(dict(op=key[0], impl=key[1], shape=case.shape, base_ms=b, head_ms=h, base_all=times["base"],
                         head_all=times["head"], base_commit=base_commit))
        shape = " ".join(f"{k}={v}" for k, v in case.shape.items())
        print(f"{key[0]:<22} {key[1]:<26} {shape:<60} base {b:9.4f} ms  head {h:9.4f} ms  head/base {h / b:6.3f}",
              flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "ab.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="REV's package as ab_base/llmkernels_base (needs git)")
    p.add_argument("rev")
    p.add_argument("--dest", default=BASE_DIR, help=argparse.SUPPRESS)  # tests
    r = sub.add_parser("run", help="time both on the GPU")
    r.add_argument("ops", nargs="*", help="op names as for `llmkernels bench` (default: all)")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--quick", action="store_true", help="the ops' quick case lists")
    r.add_argument("--out", help="folder for ab.json")
    r.add_argument("--eager", action="store_true", help="the eager cases (host cost per call)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        print(f"base {prepare(args.rev, args.dest)} in {args.dest}/llmkernels_base")
        return 0
    return run(args.ops, args.rounds, args.quick, args.out, args.eager)


if __name__ == "__main__":
    sys.exit(main())
