"""The maintained tools of scripts/: each one's help runs, the CPU-machine ones do a small real run, and
scripts/README.md lists exactly the files there."""
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-machine tool (or a CPU dry run)")


def run(*cmd, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(list(cmd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_readme_lists_every_tool():
    with open(os.path.join(SCRIPTS, "README.md")) as f:
        listed = set(re.findall(r"^\| `([^`]+)` \|", f.read(), flags=re.M))
    present = {f for f in os.listdir(SCRIPTS) if f != "README.md" and not f.startswith((".", "__"))}
    assert listed == present


@pytest.mark.parametrize("tool", ["ab.py", "e2e_profile.py", "host_profile.py", "memcheck.py", "sass_dump.py"])
def test_python_tool_help(tool):
    r = run(sys.executable, os.path.join(SCRIPTS, tool), "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:")


@pytest.mark.parametrize("tool", ["gpu.sh", "hf_e2e.sh"])
def test_shell_tool_help(tool):
    r = run("bash", os.path.join(SCRIPTS, tool), "--help")
    assert r.returncode == 0, r.stderr
    assert f"scripts/{tool}" in r.stdout
    r = run("bash", os.path.join(SCRIPTS, tool), "--no-such-option")
    assert r.returncode == 2


@cpu_only
def test_memcheck_dry_run():
    r = run(sys.executable, os.path.join(SCRIPTS, "memcheck.py"), "--device", "cpu", "xl_paged_decode")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memcheck script: all ok" in r.stdout


@cpu_only
def test_sass_dump_compiles_for_sm90(tmp_path):
    r = run(sys.executable, os.path.join(SCRIPTS, "sass_dump.py"), "--list")
    assert r.returncode == 0 and "distributed local lens" in r.stdout
    out = tmp_path / "sass"
    r = run(sys.executable, os.path.join(SCRIPTS, "sass_dump.py"), "--only", "distributed local lens", "--out",
            str(out))
    assert r.returncode == 0, r.stderr
    assert re.search(r"_local_lens_kernel +regs +\d+", r.stdout)
    files = sorted(os.listdir(out))
    assert files == ["distributed_local_lens.0.sass", "distributed_local_lens_interleaved.0.sass"]
    assert "Function : _local_lens_kernel" in (out / files[0]).read_text()
    r = run(sys.executable, os.path.join(SCRIPTS, "sass_dump.py"), "--diff", str(out), str(out))
    assert r.returncode == 0 and "2 identical, 0 different" in r.stdout


@cpu_only
def test_ab_prepare_loads_beside_the_tree(tmp_path):
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    r = run(sys.executable, os.path.join(SCRIPTS, "ab.py"), "prepare", "HEAD", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stderr
    # both packages in one process: the base's custom ops live in their own namespace
    code = ("import torch, llmkernels, llmkernels_base\n"
            "q = torch.randn(1, 4, 64, dtype=torch.float16); k = torch.randn(1, 2, 40, 64, dtype=torch.float16)\n"
            "assert torch.equal(llmkernels.masked_decode(q, k, k)[0], llmkernels_base.masked_decode(q, k, k)[0])\n"
            "assert torch.ops.llmkernels_base.masked_decode is not torch.ops.llmkernels.masked_decode\n"
            "from llmkernels_base import registry\n"
            "assert registry.spec_modules(['masked_decode'])[0].__name__.startswith('llmkernels_base.')\n")
    env_path = os.pathsep.join([ROOT, str(tmp_path)])
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=env_path))
    assert r.returncode == 0, r.stderr
    r = run(sys.executable, os.path.join(SCRIPTS, "ab.py"), "run")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr
