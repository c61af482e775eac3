"""Every op's check and benchmark entry points, by op name (imported lazily)."""
import importlib

# op name -> (its check module beside the reference: check(device) -> [CheckResult], its benchmark module:
# benches() -> [OpBench]); the benchmark layer imports the ops, never the reverse
_MODULES = {
    "masked_decode": ("ops.masked_decode.spec", "bench.specs.masked_decode"),
    "nvfp4_gemv": ("ops.nvfp4.spec", "bench.specs.nvfp4_gemv"),
    "nvfp4_linear": ("ops.nvfp4.spec", "bench.specs.nvfp4_gemv"),
    "nvfp4_moe": ("ops.nvfp4.spec", "bench.specs.nvfp4_moe"),
    "moe_topk": ("ops.moe_topk.spec", "bench.specs.moe_topk"),
    "row_topk": ("ops.row_topk.spec", "bench.specs.row_topk"),
    "sparse_mla_fwd": ("ops.sparse_mla.spec", "bench.specs.sparse_mla"),
    "sparse_mla_attn_dist": ("ops.sparse_mla.spec", "bench.specs.sparse_mla"),
    "xl_paged_decode": ("ops.xl_paged_decode.spec", "bench.specs.xl_paged_decode"),
    "sparse_mla_bwd": ("ops.sparse_mla.spec_bwd", "bench.specs.sparse_mla_bwd"),
    "inkling_decode": ("ops.inkling_decode.spec", "bench.specs.inkling_decode"),
}
SPECS = {op: "llmkernels." + check for op, (check, _) in _MODULES.items()}
BENCHES = {op: "llmkernels." + bench for op, (_, bench) in _MODULES.items()}


# public function names (the README's) -> the ops above whose checks and benchmarks cover them
ALIASES = {
    "sparse_mla": ("sparse_mla_fwd", "sparse_mla_attn_dist"), "indexer_kl_loss": ("sparse_mla_fwd",),
    "flash_mla_sparse_fwd": ("sparse_mla_fwd",), "merge_attention_states": ("masked_decode",),
    "nvfp4_quantize": ("nvfp4_gemv",), "NVFP4Linear": ("nvfp4_linear",),
}


def resolve(names=None):
    """Op names (registry keys) for names that are registry keys or aliases; all when None or empty. ValueError
    for any other name."""
    if not names:
        return list(SPECS)
    unknown = [n for n in names if n not in SPECS and n not in ALIASES]
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; known: {', '.join(SPECS)} (also {', '.join(ALIASES)})")
    return list(dict.fromkeys(o for n in names for o in ALIASES.get(n, (n,))))


def spec_modules(names=None):
    """Distinct check modules (check(device)) for the given op names or aliases (all when None), in registry order."""
    return _modules(SPECS, names)


def bench_modules(names=None):
    """Distinct benchmark modules (benches()) for the given op names or aliases (all when None), in registry order."""
    return _modules(BENCHES, names)


def _modules(table, names):
    return [importlib.import_module(m) for m in dict.fromkeys(table[n] for n in resolve(names))]
