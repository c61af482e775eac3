"""Tables, plots and the README results section, all made from the records."""
import argparse
import glob
import json
import re
from typing import List


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shape_str(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def table(records: List[dict], markdown: bool = False) -> str:
    head = ["op", "shape", "impl", "ms", "floor ms", "% of floor", "TFLOP/s"]
    rows = []
    for r in records:
        rows.append([r["op"], shape_str(r["shape"]), r["impl"], f"{r['ms']:.4f}", f"{r['floor_ms']:.4f}",
                     f"{r['pct_of_floor']:.1f}", "" if r.get("tflops") is None else f"{r['tflops']:.1f}"])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows])


def plot(records: List[dict], path: str) -> bool:
    """One panel per op: % of floor for each shape and implementation. False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'llmkernels[plot]'): no plot written")
        return False
    ops = sorted({r["op"] for r in records})
    if not ops:
        return False
    fig, axes = plt.subplots(len(ops), 1, figsize=(12, 3.5 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        recs = [r for r in records if r["op"] == op]
        shapes = list(dict.fromkeys(shape_str(r["shape"]) for r in recs))
        impls = list(dict.fromkeys(r["impl"] for r in recs))
        w = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            vals = {shape_str(r["shape"]): r["pct_of_floor"] for r in recs if r["impl"] == impl}
            xs = [i + j * w for i, s in enumerate(shapes) if s in vals]
            ax.bar(xs, [vals[s] for s in shapes if s in vals], width=w, label=impl)
        ax.axhline(100, color="k", lw=0.8, ls="--")
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))])
        ax.set_xticklabels(shapes, rotation=25, ha="right", fontsize=7)
        ax.set_ylabel("% of floor")
        ax.set_title(f"{op} ({recs[0]['device']}, {recs[0]['date']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def load(paths) -> List[dict]:
    out = []
    for p in paths:
        with open(p) as f:
            out += json.load(f)["records"]
    return out


def summary_table(records: List[dict]) -> str:
    """One markdown row per (op, shape, our impl): time, floor, % of floor, TFLOP/s, and every peer's time."""
    ours = [r for r in records if r["impl"].startswith("llmkernels")]
    lines = ["| op | shape | impl | ms | floor ms | % of floor | TFLOP/s | peers (ms) |", "|---|---|---|---|---|---|---|---|"]
    for r in ours:
        peers = [p for p in records if not p["impl"].startswith("llmkernels") and p["op"] == r["op"]
                 and p["shape"] == r["shape"]]
        peer_txt = ", ".join(f"{p['impl']} {p['ms']:.4g}" for p in peers) or "-"
        tf = "" if r.get("tflops") is None else f"{r['tflops']:.1f}"
        lines.append(f"| {r['op']} | {shape_str(r['shape'])} | {r['impl']} | {r['ms']:.4f} | {r['floor_ms']:.4f} | "
                     f"{r['pct_of_floor']:.1f} | {tf} | {peer_txt} |")
    return "\n".join(lines)


def readme_section(records: List[dict]) -> str:
    parts = []
    for dev in sorted({r["device"] for r in records}):
        recs = [r for r in records if r["device"] == dev]
        dates = sorted({r["date"] for r in recs})
        copy = sorted(r["copy_tbps"] for r in recs)
        gemm = sorted(r["gemm_tflops"] for r in recs)
        parts.append(f"**{dev}**, {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "") +
                     f"; torch {recs[0]['torch']}, triton {recs[0]['triton']}; ceilings measured in each run: copy "
                     f"{copy[0]:.2f}-{copy[-1]:.2f} TB/s, bf16 GEMM {gemm[0]:.0f}-{gemm[-1]:.0f} TFLOP/s.\n\n"
                     + summary_table(recs))
    return "\n\n".join(parts) if parts else "_No records yet._"


def update_readme(readme: str, paths) -> None:
    text = open(readme).read()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{readme} has no {start} ... {end} section")
    body = readme_section(load(paths))
    text = text[: text.index(start) + len(start)] + "\n" + body + "\n" + text[text.index(end):]
    open(readme, "w").write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Regenerate the README results table from committed records")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("records", nargs="*")
    args = ap.parse_args(argv)
    update_readme(args.readme, args.records or sorted(glob.glob("benchmarks/results/*.json")))


if __name__ == "__main__":
    main()
