"""`llmkernels --version`, the untested-version warning of `llmkernels info`, and pyproject vs the tested set."""
import os

import pytest
import torch
import triton

import llmkernels
from llmkernels import cli
from llmkernels._versions import TESTED, untested

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"llmkernels {llmkernels.__version__}"


def test_version_has_one_source():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        proj = tomllib.load(f)
    assert "version" not in proj["project"] and "version" in proj["project"]["dynamic"]
    assert proj["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "llmkernels.__version__"}


def test_installed_metadata_agrees():
    from importlib import metadata
    try:
        installed = metadata.version("llmkernels")
    except metadata.PackageNotFoundError:
        pytest.skip("llmkernels is not installed (run from the source tree)")
    assert installed == llmkernels.__version__


def test_dependency_ranges_admit_the_tested_set():
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        reqs = {r.name: r for r in map(Requirement, tomllib.load(f)["project"]["dependencies"])}
    assert "numpy" in reqs  # the Triton interpreter needs it on CPU
    for name, series in TESTED.items():
        for s in series:
            assert reqs[name].specifier.contains(s + ".0"), (name, s, str(reqs[name].specifier))
    assert not reqs["triton"].specifier.contains("3.7.0")  # the Gluon kernels use the triton 3.6 API


@pytest.mark.parametrize("versions,warned", [
    ({"torch": "2.13.0+cpu", "triton": "3.6.0"}, []),
    ({"torch": "2.11.0+cu130", "triton": "3.6.0"}, []),
    ({"torch": "2.14.1", "triton": "3.6.0"}, ["torch 2.14.1"]),
    ({"torch": "2.10.0", "triton": "3.8.0"}, ["torch 2.10.0", "triton 3.8.0"]),
])
def test_untested(versions, warned):
    assert [w.split(" (")[0] for w in untested(versions)] == warned


@pytest.mark.skipif(torch.cuda.is_available(), reason="info measures the GPU's ceilings (slow); CPU only")
def test_info_warns_outside_tested_set(capsys, monkeypatch):
    assert cli.main(["info"]) == 0
    here = untested({"torch": torch.__version__, "triton": triton.__version__})
    assert ("warning" in capsys.readouterr().err) == bool(here)  # silent on the tested set (CI's CPU set)
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    assert cli.main(["info"]) == 0
    err = capsys.readouterr().err
    assert "untested version: torch 2.14.1" in err and "untested version: triton 3.8.0" in err


def test_bench_unknown_impl_is_refused(capsys, monkeypatch):
    # checked before anything is timed (CUDA faked: the benches are only built, never run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["bench", "--impls", "nope,llmkernels", "masked_decode"]) == 2
    err = capsys.readouterr().err
    assert "no implementation named nope" in err and "llmkernels" in err


def test_usage_errors_exit_2(capsys):
    assert cli.main([]) == 2  # a bare `llmkernels` prints the help
    assert "info" in capsys.readouterr().out
    for cmd in ("check", "bench"):
        with pytest.raises(SystemExit) as e:
            cli.main([cmd, "no_such_op"])
        assert e.value.code == 2  # usage error, not the 1 of a failed check
        assert "unknown op(s) ['no_such_op']" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["check", "bench"])
def test_help_lists_op_names(capsys, cmd):
    from llmkernels.registry import ALIASES, SPECS
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert all(name in out for name in [*SPECS, *ALIASES])
