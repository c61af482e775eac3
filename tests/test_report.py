"""The README's short results table: headline shapes, our fastest impl, the fastest peer of the same run."""
from llmkernels.bench import report


def _rec(op, impl, ms, shape, date="2026-11-25", copy=3.0):
    return {"op": op, "impl": impl, "ms": ms, "shape": shape, "floor_ms": 0.5, "pct_of_floor": 50 / ms,
            "tflops": None, "bound": "memory", "date": date, "commit": "abc", "copy_tbps": copy, "gemm_tflops": 680.0,
            "device": "GPU", "torch": "2.11.0", "triton": "3.6.0"}


def test_headline_picks_fastest_ours_and_same_run_peer():
    shape = {"M": 7168, "K": 16384, "L": 1}
    records = [_rec("nvfp4_gemv", "llmkernels", 1.0, shape),
               _rec("nvfp4_gemv", "llmkernels-static-weights", 0.8, shape), _rec("nvfp4_gemv", "peer-slow", 2.0, shape),
               _rec("nvfp4_gemv", "peer-fast", 1.6, shape),
               _rec("nvfp4_gemv", "peer-other-run", 0.1, shape, date="2026-11-20", copy=2.9),
               _rec("nvfp4_gemv", "llmkernels", 0.1, {"M": 1, "K": 16, "L": 1})]  # not a headline shape
    rows = report.headline_rows(records)
    assert [(r["impl"], r["ms"]) for r in rows] == [("llmkernels-static-weights", 0.8)]
    line = report.headline_table(records).splitlines()[-1]
    assert "nvfp4_gemv (static-weights)" in line and "| peer-fast | 1.6 | 2.00x |" in line


def test_op_without_headline_shows_its_first_shape_and_no_peer():
    records = [_rec("new_op", "llmkernels", 1.0, {"n": 2}), _rec("new_op", "llmkernels", 1.0, {"n": 3})]
    assert [r["shape"] for r in report.headline_rows(records)] == [{"n": 2}]
    assert report.headline_table(records).splitlines()[-1].endswith("| - | - | - |")


def test_e2e_records_get_their_own_table():
    def e2e(fmt, graph, ms, tps):
        r = _rec("e2e_decode", "llmkernels", ms, {"model": "m", "batch": 1, "format": fmt, "graph": graph})
        return dict(r, timing="graph" if graph else "eager", tokens_per_s=tps, peak_mem_gb=6.5)

    records = [e2e("bf16", True, 8.0, 125.0), e2e("nvfp4", True, 6.0, 166.0), e2e("nvfp4", False, 30.0, 33.0),
               dict(_rec("masked_decode", "llmkernels-eager", 0.04, {"B": 4}), timing="eager")]
    text = report.readme_section(records)
    assert "| m | 1 | 125 | 166 | 6.00 (8 %) | 6.5 | abc |" in text
    assert "e2e_decode" not in text  # neither a headline row nor an eager-call row
    assert "| masked_decode | B=4 | 40.0 |" in text


def test_latency_bound_op_shows_no_percent_of_floor():
    """A latency-bound op's memory floor is nanoseconds: the tables show "-" for its % of floor."""
    records = [dict(_rec("moe_topk", "llmkernels", 0.005, {"T": 1}), bound="latency")]
    assert "| 0.005 | - (latency) |" in report.headline_table(records)
    assert "| - |  |" in report.summary_table(records)
    assert report.table(records).splitlines()[-1].split()[-1] == "-"
