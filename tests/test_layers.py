"""The package's layers, read from its import statements (function-level ones too): no import cycle between modules,
and no import from a lower layer up to a higher one. Base (llmkernels._*, checking) < ops < bench < hf, distributed,
kvpress (and its bench) < registry, cli; the package root is the facade over all of them."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llmkernels")
LAYERS = {"ops": 1, "bench": 2, "hf": 3, "distributed": 3, "kvpress": 3, "kvpress_bench": 3, "registry": 4, "cli": 4}


def _modules():
    """module name -> file, for every module of the package."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _graph(mods):
    """module -> the package's modules it imports (a name imported from a package counts as its submodule when
    one exists, else as the package)."""
    graph = {}
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                deps |= {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[mod] = {d for d in deps if d in mods and d != mod}
    return graph


def _layer(mod):
    parts = mod.split(".")
    return None if len(parts) == 1 else LAYERS.get(parts[1], 0)


def test_no_upward_import():
    graph = _graph(_modules())
    up = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                if _layer(m) is not None and _layer(d) is not None and _layer(d) > _layer(m))
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_no_import_cycle():
    graph = _graph(_modules())
    state, cycles = {}, []

    def visit(m, stack):  # depth-first: a module met again while on the stack closes a cycle
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_check_sees_the_graph():
    graph = _graph(_modules())
    assert "llmkernels.ops.masked_decode.kernel" in graph["llmkernels.ops.masked_decode.op"]
    assert "llmkernels._pdl" in graph["llmkernels.ops.nvfp4.tiled"]
    assert "llmkernels.ops.masked_decode.spec" in graph["llmkernels.bench.specs.masked_decode"]


def test_nvfp4_gemv_is_a_deprecated_alias():
    """ops.nvfp4_gemv (renamed ops.nvfp4, issue 48) still imports, as the same modules, with a DeprecationWarning."""
    import importlib
    import sys
    import warnings
    sys.modules.pop("llmkernels.ops.nvfp4_gemv", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("llmkernels.ops.nvfp4_gemv.op")
    assert old is importlib.import_module("llmkernels.ops.nvfp4.op")
    assert any(issubclass(w.category, DeprecationWarning) and "renamed" in str(w.message) for w in caught)
