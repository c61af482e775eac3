"""Every op's check and benchmark entry points, by op name (imported lazily)."""
import importlib

# op name -> module with check(device) -> [CheckResult] and benches() -> [OpBench]
SPECS = {
    "masked_decode": "llmkernels.ops.masked_decode.spec",
    "nvfp4_gemv": "llmkernels.ops.nvfp4_gemv.spec", "nvfp4_linear": "llmkernels.ops.nvfp4_gemv.spec",
    "sparse_mla_fwd": "llmkernels.ops.sparse_mla.spec",
    "sparse_mla_attn_dist": "llmkernels.ops.sparse_mla.spec",
    "xl_paged_decode": "llmkernels.ops.xl_paged_decode.spec",
    "sparse_mla_bwd": "llmkernels.ops.sparse_mla.spec_bwd",
}


def spec_modules(names=None):
    """Distinct spec modules for the given op names (all when None), in registry order."""
    if names:
        unknown = [n for n in names if n not in SPECS]
        if unknown:
            raise SystemExit(f"unknown op(s) {unknown}; known: {sorted(SPECS)}")
    wanted = [SPECS[n] for n in (names or SPECS)]
    return [importlib.import_module(m) for m in dict.fromkeys(wanted)]
