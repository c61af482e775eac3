import functools

import pytest

from llmkernels.bench import harness
from llmkernels.bench.harness import Case, Impl, OpBench


@pytest.fixture
def fake_device(monkeypatch):
    """The harness's device calls replaced by stand-ins that log their order (the harness itself needs CUDA)."""
    calls = []

    def copy_bandwidth():
        calls.append("copy")
        return 3.0e12

    @functools.lru_cache(maxsize=None)
    def gemm_rate():
        calls.append("gemm")
        return 700.0e12

    def time_impl(impl, case):
        calls.append(f"time {impl.name} {case.shape['n']}")
        if impl.name == "broken":
            raise RuntimeError("peer failed")
        return 0.5, "graph"

    monkeypatch.setattr(harness, "copy_bandwidth", copy_bandwidth)
    monkeypatch.setattr(harness, "gemm_rate", gemm_rate)
    monkeypatch.setattr(harness, "time_impl", time_impl)
    monkeypatch.setattr(harness.torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(harness.torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(harness.time, "sleep", lambda s: calls.append(f"sleep {s}"))
    return calls


def _bench(op):
    cases = lambda quick: [Case(shape={"n": 1}, make_inputs=dict, bytes=3 * 10**9),  # noqa: E731
                           Case(shape={"n": 2}, make_inputs=dict, bytes=0, flops=7 * 10**11, bound="compute")]
    return OpBench(op, cases, [Impl("llmkernels", lambda x: None), Impl("broken", lambda x: None),
                               Impl("absent", lambda x: None, available=lambda: "not installed")])


def test_run_op_bench_ceilings_around_the_cases(fake_device):
    # the copy rate before any case, the GEMM ceiling only after the last one (right after it the GPU runs slow),
    # then a pause; floors use the ceiling of the case's bound; failing and absent peers are skipped
    logs = []
    recs = harness.run_op_bench(_bench("op_a"), log=logs.append)
    assert fake_device == ["copy", "time llmkernels 1", "time broken 1", "time llmkernels 2", "time broken 2",
                           "gemm", "sleep 5"]
    assert [(r["impl"], r["shape"]["n"]) for r in recs] == [("llmkernels", 1), ("llmkernels", 2)]
    mem, comp = recs
    assert mem["floor_ms"] == pytest.approx(1.0) and mem["pct_of_floor"] == pytest.approx(200.0)  # 3 GB at 3 TB/s
    # 0.7 TFLOP: 1 ms at 700 TFLOP/s; done in 0.5 ms = 1400 TFLOP/s
    assert comp["floor_ms"] == pytest.approx(1.0) and comp["tflops"] == pytest.approx(1400.0)
    assert mem["copy_tbps"] == pytest.approx(3.0) and mem["gemm_tflops"] == pytest.approx(700.0)
    assert any("skipping peer absent" in m for m in logs) and any("broken failed" in m for m in logs)
    # a second op of the same run reuses the GEMM figure: no second GEMM and no pause
    del fake_device[:]
    harness.run_op_bench(_bench("op_b"), log=logs.append)
    assert "gemm" not in fake_device and not any(c.startswith("sleep") for c in fake_device)


def test_eager_cases_interleaved_before_any_ceiling(fake_device, monkeypatch):
    # eager timings first (a copy or GEMM burst changes the clocks), all implementations of a case interleaved
    def interleaved(fns, *a):
        fake_device.append(f"eager x{len(fns)}")
        return [0.04 + 0.01 * i for i in range(len(fns))]

    monkeypatch.setattr(harness, "eager_interleaved", interleaved)
    cases = lambda quick: [Case(shape={"n": n}, make_inputs=dict, bytes=0, timing="eager") for n in (1, 2)]  # noqa
    bench = OpBench("op_e", cases, [Impl("llmkernels-eager", lambda x: None), Impl("peer-eager", lambda x: None),
                                    Impl("absent", lambda x: None, available=lambda: "not installed")])
    recs = harness.run_op_bench(bench, log=lambda m: None)
    assert fake_device[:3] == ["eager x2", "eager x2", "copy"]
    assert [(r["impl"], r["ms"], r["timing"]) for r in recs][:2] == [("llmkernels-eager", 0.04, "eager"),
                                                                     ("peer-eager", 0.05, "eager")]


def test_registry_resolves_public_names():
    from llmkernels.registry import SPECS, resolve
    assert resolve(None) == list(SPECS) and resolve([]) == list(SPECS)
    assert resolve(["sparse_mla"]) == ["sparse_mla_fwd", "sparse_mla_attn_dist"]
    assert resolve(["merge_attention_states", "masked_decode", "nvfp4_linear"]) == ["masked_decode", "nvfp4_linear"]
    for name in SPECS:  # every registry key resolves to itself
        assert resolve([name]) == [name]
    with pytest.raises(SystemExit, match="unknown op"):
        resolve(["sparse_mla", "nosuch"])
