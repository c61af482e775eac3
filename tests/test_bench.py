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

    def read_bandwidth():
        calls.append("read")
        return 4.0e12

    def write_bandwidth():
        calls.append("write")
        return 2.0e12

    def time_impl(impl, case):
        calls.append(f"time {impl.name} {case.shape['n']}")
        if impl.name == "broken":
            raise RuntimeError("peer failed")
        return 0.5, "graph"

    monkeypatch.setattr(harness, "copy_bandwidth", copy_bandwidth)
    monkeypatch.setattr(harness, "gemm_rate", gemm_rate)
    monkeypatch.setattr(harness, "read_bandwidth", read_bandwidth)
    monkeypatch.setattr(harness, "write_bandwidth", write_bandwidth)
    monkeypatch.setattr(harness, "time_impl", time_impl)
    monkeypatch.setattr(harness.torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(harness.torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(harness.time, "sleep", lambda s: calls.append(f"sleep {s}"))
    return calls


def _bench(op):
    cases = lambda quick: [Case(shape={"n": 1}, make_inputs=dict, bytes=3 * 10**9, write_bytes=10**9),  # noqa: E731
                           Case(shape={"n": 2}, make_inputs=dict, bytes=0, flops=7 * 10**11, bound="compute")]
    return OpBench(op, cases, [Impl("llmkernels", lambda x: None), Impl("broken", lambda x: None),
                               Impl("absent", lambda x: None, available=lambda: "not installed")])


def test_run_op_bench_ceilings_around_the_cases(fake_device):
    # the copy rate before any case, the GEMM ceiling only after the last one (right after it the GPU runs slow),
    # then a pause; floors use the ceiling of the case's bound; failing and absent peers are skipped
    logs = []
    recs = harness.run_op_bench(_bench("op_a"), log=logs.append)
    assert fake_device == ["copy", "read", "write", "time llmkernels 1", "time broken 1", "time llmkernels 2",
                           "time broken 2", "gemm", "sleep 5"]
    assert [(r["impl"], r["shape"]["n"]) for r in recs] == [("llmkernels", 1), ("llmkernels", 2)]
    mem, comp = recs
    # 2 GB read at 4 TB/s + 1 GB written at 2 TB/s
    assert mem["floor_ms"] == pytest.approx(1.0) and mem["pct_of_floor"] == pytest.approx(200.0)
    assert mem["read_tbps"] == pytest.approx(4.0) and mem["write_tbps"] == pytest.approx(2.0)
    # 0.7 TFLOP: 1 ms at 700 TFLOP/s; done in 0.5 ms = 1400 TFLOP/s
    assert comp["floor_ms"] == pytest.approx(1.0) and comp["tflops"] == pytest.approx(1400.0)
    assert mem["copy_tbps"] == pytest.approx(3.0) and mem["gemm_tflops"] == pytest.approx(700.0)
    assert any("skipping peer absent" in m for m in logs) and any("broken failed" in m for m in logs)
    # a second op of the same run reuses the GEMM figure: no second GEMM and no pause
    del fake_device[:]
    harness.run_op_bench(_bench("op_b"), log=logs.append)
    assert "gemm" not in fake_device and not any(c.startswith("sleep") for c in fake_device)


def test_eager_passes_interleaved_before_any_ceiling(fake_device, monkeypatch):
    # eager timings first (a copy or GEMM burst changes the clocks): every case of every op in each pass, the
    # implementations of a case interleaved; ms = the median of all rounds of all passes; failing peers dropped
    def interleaved(fns, rounds=7, raw=False, warmup=20, calls=300):
        fake_device.append(f"eager x{len(fns)} w{warmup}")
        assert raw and rounds == harness.EAGER_ROUNDS
        k = len([c for c in fake_device if c.startswith("eager")])  # a later pass reads faster
        return [[(0.04 + 0.01 * i) / k + 1e-4 * r for r in range(rounds)] for i in range(len(fns))]

    def broken():
        raise RuntimeError("peer failed")

    monkeypatch.setattr(harness, "eager_interleaved", interleaved)
    cases = lambda quick: [Case(shape={"n": n}, make_inputs=dict, bytes=0, timing="eager") for n in (1, 2)]  # noqa
    bench = OpBench("op_e", cases, [Impl("llmkernels-eager", lambda x: lambda: None),
                                    Impl("peer-eager", lambda x: lambda: None),
                                    Impl("broken-eager", lambda x: broken),
                                    Impl("absent", lambda x: None, available=lambda: "not installed")])
    logs = []
    recs = harness.run_eager([bench, OpBench("op_f", cases, bench.impls[:1])], passes=3, log=logs.append)
    assert fake_device[:4] == ["eager x2 w20", "eager x2 w20", "eager x1 w20", "eager x1 w20"]
    assert fake_device[4:12] == ["eager x2 w3", "eager x2 w3", "eager x1 w3", "eager x1 w3"] * 2
    assert fake_device[12:] == ["copy", "gemm"]
    assert [(r["op"], r["impl"], r["shape"]["n"]) for r in recs] == [
        ("op_e", "llmkernels-eager", 1), ("op_e", "peer-eager", 1), ("op_e", "llmkernels-eager", 2),
        ("op_e", "peer-eager", 2), ("op_f", "llmkernels-eager", 1), ("op_f", "llmkernels-eager", 2)]
    r = recs[0]
    assert r["timing"] == "eager" and r["rounds"] == 3 * harness.EAGER_ROUNDS
    assert r["pass_ms"] == pytest.approx([0.04 / k + 1e-4 for k in (1, 5, 9)])
    assert r["ms"] == pytest.approx(0.04 / 5 + 1e-4)  # the median round: the middle pass's middle round
    assert any("skipping peer absent" in m for m in logs) and any("broken-eager failed" in m for m in logs)
    assert harness.run_op_bench(bench, log=lambda m: None)[0]["impl"] == "llmkernels-eager"  # through run_eager


def test_registry_resolves_public_names():
    from llmkernels.registry import SPECS, resolve
    assert resolve(None) == list(SPECS) and resolve([]) == list(SPECS)
    assert resolve(["sparse_mla"]) == ["sparse_mla_fwd", "sparse_mla_attn_dist"]
    assert resolve(["merge_attention_states", "masked_decode", "nvfp4_linear"]) == ["masked_decode", "nvfp4_linear"]
    for name in SPECS:  # every registry key resolves to itself
        assert resolve([name]) == [name]
    with pytest.raises(ValueError, match="unknown op"):
        resolve(["sparse_mla", "nosuch"])


def test_eager_benches_build_on_cpu():
    """Every eager bench and its peers can be constructed without a GPU (the peers' builders resolve); a stale
    reference to a moved peer once stopped `llmkernels bench --eager` before any timing."""
    from llmkernels.bench import eager
    benches = eager.benches()
    assert {"masked_decode", "inkling_decode", "sparse_mla_fwd", "xl_paged_decode"} <= {b.op for b in benches}
    assert all(callable(i.build) and callable(i.available) for b in benches for i in b.impls)
    assert [b.op for b in eager.benches(["inkling_decode"])] == ["inkling_decode"]


def test_merge_records_replaces_in_place(tmp_path):
    from llmkernels.bench.harness import merge_records
    rec = lambda op, ms: {"op": op, "impl": "llmkernels", "shape": {"n": 1}, "ms": ms}  # noqa: E731
    path = tmp_path / "dev.json"
    merge_records(path, [rec("a", 1.0), rec("b", 2.0)])
    merged = merge_records(path, [rec("c", 3.0), rec("a", 0.5)])
    assert [(r["op"], r["ms"]) for r in merged] == [("a", 0.5), ("b", 2.0), ("c", 3.0)]
