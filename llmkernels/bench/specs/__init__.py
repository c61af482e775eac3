"""Benchmark specs, one module per op family: benches() -> [OpBench] (llmkernels.registry.BENCHES)."""
