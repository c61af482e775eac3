"""The torch and triton releases llmkernels is tested with, written once: `llmkernels info` warns outside them, and
tests/test_cli.py checks that pyproject's dependency ranges admit them."""
# torch 2.11 (+cu130): the H100's GPU tests and benchmarks; torch 2.13.0+cpu: CI's CPU run (Triton interpreter).
# triton 3.6 only: the Gluon kernels use its API.
TESTED: dict[str, tuple] = {"torch": ("2.11", "2.13"), "triton": ("3.6",)}


def untested(versions: dict[str, str]) -> list[str]:
    """{"torch": "2.14.1", ...} -> ["torch 2.14.1 (tested: 2.11.x, 2.13.x)"] for each release outside TESTED."""
    out = []
    for name, v in versions.items():
        series = ".".join(v.split("+")[0].split(".")[:2])
        if series not in TESTED[name]:
            out.append(f"{name} {v} (tested: {', '.join(s + '.x' for s in TESTED[name])})")
    return out
