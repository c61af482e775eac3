"""Tables, plots, the README's results section and docs/results.md, all made from the records."""
import argparse
import glob
import json
import re


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shape_str(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def pct_str(r: dict) -> str:
    """% of floor, or "-" for a latency-bound op (its bytes take nanoseconds: the figure would say nothing)."""
    return "-" if r.get("bound") == "latency" else f"{r['pct_of_floor']:.1f}"


def table(records: list[dict], markdown: bool = False) -> str:
    head = ["op", "shape", "impl", "ms", "floor ms", "% of floor", "TFLOP/s"]
    rows = []
    for r in records:
        rows.append([r["op"], shape_str(r["shape"]), r["impl"], f"{r['ms']:.4f}", f"{r['floor_ms']:.4f}",
                     pct_str(r), "" if r.get("tflops") is None else f"{r['tflops']:.1f}"])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows])


def plot(records: list[dict], path: str) -> bool:
    """One panel per op: % of floor for each shape and implementation. False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'llmkernels[plot]'): no plot written")
        return False
    # % of floor is a GPU-time figure; the model-level records (DSA block, kvpress, Inkling model) carry none
    records = [r for r in records if not eager(r) and "pct_of_floor" in r and r.get("bound") != "latency"]
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


def load(paths) -> list[dict]:
    out = []
    for p in paths:
        with open(p) as f:
            out += json.load(f)["records"]
    return out


# The README's short table: one row per op at the shape it is built for (shape keys that must match; an op with no
# entry here shows its first recorded shape). The full table is docs/results.md.
HEADLINES = [
    ("masked_decode", {"B": 1, "L": 65536, "kept": 1.0}),
    ("masked_decode", {"B": 1, "L": 65536, "kept": 0.5}),
    ("xl_paged_decode", {"num_seqs": 64, "layout": "nhd"}),
    ("inkling_decode", {"B": 1, "Hkv": 8, "L": 65536}),
    ("sparse_mla_fwd", {"h_q": 128, "topk": 2048, "d_qk": 576}),
    ("sparse_mla_attn_dist", {"h_q": 128, "topk": 2048, "d_qk": 576}),
    ("sparse_mla_bwd", {"h_q": 128, "topk": 2048, "d_qk": 576}),
    ("nvfp4_gemv", {"M": 7168, "K": 16384, "L": 1}),
    ("nvfp4_linear", {"T": 1, "N": 28672, "K": 4096}),
    ("cp_decode", {"B": 8, "L": 1048576, "world": 1}),  # the one-GPU baseline of the row below (same run)
    ("cp_decode", {"B": 8, "L": 1048576, "world": 2}),
]


def _ours(r: dict) -> bool:
    return r["impl"].startswith("llmkernels")


def eager(r: dict) -> bool:
    """A record of `llmkernels bench --eager`: wall time per eager call (host included), not GPU time."""
    return r.get("timing") == "eager" and not e2e(r)


def e2e(r: dict) -> bool:
    """A record of a model-level benchmark, with its own table: the end-to-end decode (llmkernels.hf.bench), the DSA
    attention block (llmkernels.hf.dsa_bench), kvpress's presses (llmkernels.kvpress_bench), the Inkling-shaped model
    (llmkernels.hf.inkling_bench)."""
    return r["op"] in ("e2e_decode", "dsa_attention", "kvpress_decode", "inkling_model_decode")


def e2e_table(records: list[dict]) -> str:
    """Greedy decode of the random-weight model shapes, CUDA-graph steps: bf16 beside NVFP4 where bf16 fits."""
    rows = {}
    for r in records:
        if r["op"] == "e2e_decode" and r["shape"].get("graph"):
            sh = r["shape"]
            model = sh["model"] + (f" (torch.compile {sh['compile']})" if sh.get("compile") else "")
            rows.setdefault((model, sh["batch"]), {})[sh["format"]] = r
    if not rows:
        return ""
    lines = ["| model (random weights) | batch | bf16 tok/s | NVFP4 tok/s | NVFP4 ms / step (% of floor) | "
             "NVFP4 peak GB | commit |", "|---|---|---|---|---|---|---|"]
    for (model, batch), f in sorted(rows.items()):
        b, n = f.get("bf16"), f.get("nvfp4")
        if n is None:
            continue
        bf = f"{b['tokens_per_s']:.0f}" if b else "does not fit"
        lines.append(f"| {model} | {batch} | {bf} | "
                     f"{n['tokens_per_s']:.0f} | {n['ms']:.2f} ({n['pct_of_floor']:.0f} %) | "
                     f"{n['peak_mem_gb']:.1f} | {n.get('commit', '')} |")
    return "\n".join(lines)


def eager_table(records: list[dict]) -> str:
    """Eager calls: our wall time per call beside the peers' from the same run (us), one row per op and shape."""
    rows = [r for r in records if eager(r) and _ours(r)]
    if not rows:
        return ""
    lines = ["| op | shape | llmkernels us per call | passes | peers in the same run (us per call) | commit |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        peers = ", ".join(f"{p['impl'].removesuffix('-eager')} {p['ms'] * 1e3:.1f}" for p in _peers(records, r, True))
        passes = f"{min(r['pass_ms']) * 1e3:.1f}-{max(r['pass_ms']) * 1e3:.1f}" if r.get("pass_ms") else "-"
        lines.append(f"| {r['op']} | {shape_str(r['shape'])} | {r['ms'] * 1e3:.1f} | {passes} | {peers or '-'} | "
                     f"{r.get('commit', '')} |")
    return "\n".join(lines)


def _run(r: dict) -> tuple:
    """Records of one `llmkernels bench` run of an op share its date, commit and the ceilings measured in it."""
    return r["date"], r.get("commit"), r["copy_tbps"], r["gemm_tflops"]


def _peers(records: list[dict], r: dict, same_run: bool) -> list[dict]:
    return [p for p in records if not _ours(p) and p["op"] == r["op"] and p["shape"] == r["shape"]
            and (not same_run or _run(p) == _run(r))]


def summary_table(records: list[dict]) -> str:
    """One markdown row per (op, shape, our impl): time, floor, % of floor, TFLOP/s, and every peer's time."""
    lines = ["| op | shape | impl | ms | floor ms | % of floor | TFLOP/s | peers (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in filter(_ours, records):
        peer_txt = ", ".join(f"{p['impl']} {p['ms']:.4g}" for p in _peers(records, r, False)) or "-"
        tf = "" if r.get("tflops") is None else f"{r['tflops']:.1f}"
        lines.append(f"| {r['op']} | {shape_str(r['shape'])} | {r['impl']} | {r['ms']:.4f} | {r['floor_ms']:.4f} | "
                     f"{pct_str(r)} | {tf} | {peer_txt} |")
    return "\n".join(lines)


def headline_rows(records: list[dict]) -> list[dict]:
    """Our fastest impl at each headline shape (HEADLINES, then the first shape of any op not listed there)."""
    ours = list(filter(_ours, records))
    picks = [(op, want) for op, want in HEADLINES]
    listed = {op for op, _ in HEADLINES}
    for r in ours:
        if r["op"] not in listed:
            listed.add(r["op"])
            picks.append((r["op"], r["shape"]))
    rows = []
    for op, want in picks:
        match = [r for r in ours if r["op"] == op and all(r["shape"].get(k) == v for k, v in want.items())]
        for shape in list(dict.fromkeys(json.dumps(r["shape"]) for r in match))[:1]:
            rows.append(min((r for r in match if json.dumps(r["shape"]) == shape), key=lambda r: r["ms"]))
    return rows


def headline_table(records: list[dict]) -> str:
    """The short table: headline rows, each with the fastest peer timed in the same run."""
    lines = ["| op | shape | llmkernels ms | % of floor | fastest peer in the same run | peer ms | speed-up |",
             "|---|---|---|---|---|---|---|"]
    for r in headline_rows(records):
        peers = _peers(records, r, True)
        best = min(peers, key=lambda p: p["ms"]) if peers else None
        impl = "" if r["impl"] == "llmkernels" else f" ({r['impl'].removeprefix('llmkernels-')})"
        tf = f", {r['tflops']:.0f} TFLOP/s" if r["bound"] == "compute" else ""
        peer = ["-", "-", "-"] if best is None else [best["impl"], f"{best['ms']:.4g}", f"{best['ms'] / r['ms']:.2f}x"]
        lines.append(f"| {r['op']}{impl} | {shape_str(r['shape'])} | {r['ms']:.4g} | {pct_str(r)} "
                     f"({r['bound']}{tf}) | " + " | ".join(peer) + " |")
    return "\n".join(lines)


def _device_sections(records: list[dict], body) -> str:
    parts = []
    for dev in sorted({r["device"] for r in records}):
        recs = [r for r in records if r["device"] == dev]
        dates = sorted({r["date"] for r in recs})
        copy = sorted(r["copy_tbps"] for r in recs if r.get("copy_tbps"))
        read = sorted(r["read_tbps"] for r in recs if r.get("read_tbps"))
        gemm = sorted(r["gemm_tflops"] for r in recs if r.get("gemm_tflops"))
        vers = ", ".join(sorted({f"torch {r['torch']}, triton {r['triton']}" for r in recs}))
        parts.append(f"**{dev}**, {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "") +
                     f"; {vers}; ceilings measured in each run: "
                     + (f"copy {copy[0]:.2f}-{copy[-1]:.2f} TB/s" if copy else "none")
                     + (f", read {read[0]:.2f}-{read[-1]:.2f} TB/s" if read else "")
                     + (f", bf16 GEMM {gemm[0]:.0f}-{gemm[-1]:.0f} TFLOP/s" if gemm else "") + ".\n\n"
                     + body(recs))
    return "\n\n".join(parts) if parts else "_No records yet._"


def _with_eager(body, e2e_rows=False):
    """body(GPU-time records, and with e2e_rows every e2e_decode record), then the eager-call and whole-model tables
    of the same device, if any."""
    def both(recs):
        timed = [r for r in recs if not eager(r) and (r["op"] == "e2e_decode" if e2e(r) else True)
                 and (e2e_rows or not e2e(r))]
        et, mt, dt, kt = eager_table(recs), e2e_table(recs), dsa_table(recs), kvpress_table(recs)
        it = inkling_table(recs)
        return "\n\n".join(t for t in (body(timed) if timed else "", EAGER_HEADER + "\n\n" + et if et else "",
                                      E2E_HEADER + "\n\n" + mt if mt else "",
                                      DSA_HEADER + "\n\n" + dt if dt else "",
                                      KVPRESS_HEADER + "\n\n" + kt if kt else "",
                                      INKLING_HEADER + "\n\n" + it if it else "") if t)
    return both


EAGER_HEADER = ("Eager calls (`llmkernels bench --eager`): wall time per call of 300 back-to-back calls from plain "
                "PyTorch at a small shape, host included: the median of 21 rounds, 3 in each of 7 passes over all ops, "
                "each interleaved with the peers' rounds; the passes column gives the fastest and slowest pass's "
                "median (the GPU machine's virtual CPUs change speed by up to 1.7x between passes, peers alike). "
                "Peers through their usual eager API.")


E2E_HEADER = ("Whole models (`python -m llmkernels.hf.bench`): greedy decode with a static KV cache (prompt 512), "
              "one CUDA graph per step, through Hugging Face transformers; floor = the step's weight and cache bytes "
              "at the read rate measured in the same run (the copy rate in records without one). Eager steps are in "
              "docs/results.md.")


def _by_impl(records: list[dict], op: str, key) -> dict:
    """{key(shape): {impl: record}} of the records of op (the model-level tables' rows)."""
    rows = {}
    for r in records:
        if r.get("op") == op:
            rows.setdefault(key(r["shape"]), {})[r["impl"]] = r
    return rows


DSA_HEADER = ("DeepSeek sparse attention in transformers (`python -m llmkernels.hf.dsa_bench`): one "
              "DeepSeek-V3.2-shaped attention block with its indexer (hidden 7168, 128 heads, index_topk 2048; random "
              "bf16 weights, batch 1), `patch_attention` against transformers' own eager and SDPA paths in the same "
              "run; decode replayed from a CUDA graph per call (both), training = forward + backward with the indexer "
              "loss. OOM: ran out of the GPU's memory.")


def dsa_table(records: list[dict]) -> str:
    """Per phase and size: our ms beside transformers' eager and SDPA (speed-up over its fastest), peak memory, and
    our split (indexer, sparse_mla with its % of floor) or decode's cache bytes per token."""
    rows = _by_impl(records, "dsa_attention", lambda sh: (sh["phase"], sh.get("S", sh.get("L"))))
    if not rows:
        return ""
    order = {"prefill": 0, "decode": 1, "train": 2}
    lines = ["| phase | S or L | llmkernels ms (peak GB) | transformers eager | transformers SDPA | speed-up over "
             "transformers' fastest | notes |", "|---|---|---|---|---|---|---|"]

    def cell(r):
        if r is None:
            return "-"
        if r.get("error"):
            return "OOM" if "out of memory" in r["error"] else "failed"
        return f"{r['ms']:.3f}" + (f" ({r['peak_mem_gb']:.1f})" if r.get("peak_mem_gb") else "")
    for (phase, n), by in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
        o = by.get("llmkernels")
        peers = [r for k, r in by.items() if k.startswith("transformers") and r.get("ms")]
        best = min(peers, key=lambda r: r["ms"]) if peers else None
        up = f"{best['ms'] / o['ms']:.1f}x" if best and o and o.get("ms") else "-"
        notes = []
        if o and o.get("split_ms"):
            sp = o["split_ms"]
            notes.append(f"indexer {sp['indexer']:.2f} ms, sparse_mla {sp['sparse_mla']:.2f} ms"
                         + (f" ({o['sparse_mla_pct_of_floor']:.0f} % of floor)" if o.get("sparse_mla_pct_of_floor")
                            else ""))
        if o and o.get("cache_bytes_per_token") and best and best.get("cache_bytes_per_token"):
            notes.append(f"cache {o['cache_bytes_per_token']:.0f} vs {best['cache_bytes_per_token']:.0f} B/token")
        if o and o.get("ms_eager") and phase == "decode":
            notes.append(f"eager calls {o['ms_eager']:.3f} vs {best['ms_eager']:.3f} ms" if best and
                         best.get("ms_eager") else f"eager calls {o['ms_eager']:.3f} ms")
        c = by.get("llmkernels-compiled")
        if c and c.get("ms"):
            notes.append(f"compiled (inductor) {c['ms']:.3f} ms" + (f", {best['ms'] / c['ms']:.1f}x" if best else ""))
        layers = next((r["shape"]["layers"] for r in by.values() if "layers" in r["shape"]), None)
        label = f"{phase} ({layers} layers)" if layers else phase
        lines.append(f"| {label} | {n} | {cell(o)} | {cell(by.get('transformers-eager'))} | "
                     f"{cell(by.get('transformers-sdpa'))} | {up} | {'; '.join(notes)} |")
    return "\n".join(lines)


KVPRESS_HEADER = ("kvpress's head-wise presses (`python -m llmkernels.kvpress_bench`): decode steps of a "
                  "Llama-3.1-8B-shaped model (random bf16 weights) after a prefill under AdaKVPress, ms a step "
                  "(median, CUDA events; \"(graph)\": one CUDA graph a step, else eager; records of commit b7a0e89 "
                  "predate PressDecoder: their llmkernels row is the eager adapter with a drop mask); the last column: "
                  "one layer's decode attention with the press's kept tokens over the same with nothing dropped, "
                  "beside the kept fraction.")


def kvpress_table(records: list[dict]) -> str:
    """Per (context, batch, ratio): each impl's ms a step, ours over no-press and kvpress, the attention's scaling."""
    rows = _by_impl(records, "kvpress_decode",
                    lambda sh: (sh["model"], sh["press"], sh["context"], sh["batch"], sh["ratio"]))
    if not rows:
        return ""
    lines = ["| model | press | context | batch | ratio | llmkernels ms | compact (cache GB vs all) | no-press | "
             "llmkernels eager | kvpress | transformers | speed-up vs no-press / kvpress | "
             "attention kept / all (kept fraction) | compiled: ours / compact / no-press (speed-up) |",
             "|---|" * 1 + "---|" * 13]
    for (model, press, ctx, b, ratio), by in sorted(rows.items()):
        o, n, e, k, t = (by.get(i) for i in ("llmkernels", "no-press", "llmkernels-eager", "kvpress", "transformers"))
        c = by.get("llmkernels-compact")
        cm = f"{c['ms']:.2f} ({c['cache_gb']:.1f} vs {o['cache_gb']:.1f})" if c and o and "cache_gb" in o else "-"
        ms = lambda r: f"{r['ms']:.2f}" + (" (graph)" if r.get("timing") == "graph" else "") if r else "-"  # noqa
        up = f"{n['ms'] / o['ms']:.2f}x / {k['ms'] / o['ms']:.2f}x" if o and n and k else "-"
        att = f"{o['attn_ms'] / n['attn_ms']:.2f} ({o['kept']:.2f})" if o and n and n.get("attn_ms") else "-"
        if att != "-" and c and c.get("attn_ms") and c["attn_ms"] != o["attn_ms"]:  # compact: the kept prefix
            att += f"; compact {c['attn_ms'] / n['attn_ms']:.2f}"
        co, cc, cn = (by.get(i + "-compiled") for i in ("llmkernels", "llmkernels-compact", "no-press"))
        comp = f"{co['ms']:.2f} / {cc['ms'] if cc else float('nan'):.2f} / {cn['ms']:.2f} " \
               f"({cn['ms'] / co['ms']:.2f}x)" if co and cn else "-"
        lines.append(f"| {model} | {press} | {ctx} | {b} | {ratio} | {ms(o)} | {cm} | {ms(n)} | {ms(e)} | {ms(k)} | "
                     f"{ms(t)} | {up} | {att} | {comp} |")
    return "\n".join(lines)


INKLING_HEADER = ("Inkling in transformers (`python -m llmkernels.hf.inkling_bench`): a small Inkling-shaped random "
                  "text model (12 layers, 10 sliding with window 512 and 2 full with rel_extent 1024; hidden 2048, 16 "
                  "query heads of 128; bf16), greedy decode at batch 1 after a prompt of L tokens: `patch_attention` "
                  "+ `StaticDecoder` (one CUDA graph a step) and the patched model's eager steps on transformers' "
                  "DynamicCache, beside transformers' own eager path in the same run.")


def inkling_table(records: list[dict]) -> str:
    """Per context: each impl's ms a step and tokens/s, speed-up over transformers' own path, prefill seconds."""
    rows = _by_impl(records, "inkling_model_decode", lambda sh: (sh["L"], sh["B"]))
    if not rows:
        return ""
    lines = ["| L | batch | impl | timing | ms / token | tokens/s | vs transformers | prefill s | commit |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (L, B), by in sorted(rows.items()):
        base = by.get("transformers-eager")
        for impl, r in by.items():
            up = f"{base['ms'] / r['ms']:.2f}x" if base else "-"
            pre = f"{r['prefill_s']:.1f}" if r.get("prefill_s") is not None else "-"
            lines.append(f"| {L} | {B} | {impl} | {r['timing']} | {r['ms']:.2f} | {r['tokens_per_s']:.0f} | {up} | "
                         f"{pre} | {r.get('commit', '')} |")
    return "\n".join(lines)


def readme_section(records: list[dict]) -> str:
    return _device_sections(records, _with_eager(headline_table))


FULL_HEADER = """# Benchmark results (all records)

Generated from `benchmarks/results/*.json` by `python -m llmkernels.bench.report`; do not edit by hand. The README
shows the headline rows; what "% of floor" means is explained there. `ms` is the median time of one call, `floor ms`
the time the call's unavoidable bytes take at the read and write rates measured in the same run (memory-bound ops;
records without a read rate: at the copy rate) or its FLOPs at the measured bf16 GEMM rate (compute-bound ops).
Peers are listed with their times in ms; a peer missing from a row was not installed or does not support the case.
How each op is timed, and the history of every figure:
[benchmarks/NOTES.md](../benchmarks/NOTES.md).
"""


def full_page(records: list[dict]) -> str:
    return FULL_HEADER + "\n" + _device_sections(records, _with_eager(summary_table, e2e_rows=True)) + "\n"


def update_readme(readme: str, paths) -> None:
    with open(readme) as f:
        text = f.read()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{readme} has no {start} ... {end} section")
    body = readme_section(load(paths))
    text = text[: text.index(start) + len(start)] + "\n" + body + "\n" + text[text.index(end):]
    with open(readme, "w") as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Regenerate the README's results table (headline rows) and the full "
                                             "table (docs/results.md) from committed records")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--full", default="docs/results.md")
    ap.add_argument("records", nargs="*")
    args = ap.parse_args(argv)
    paths = args.records or sorted(glob.glob("benchmarks/results/*.json"))
    update_readme(args.readme, paths)
    with open(args.full, "w") as f:
        f.write(full_page(load(paths)))


if __name__ == "__main__":
    main()
