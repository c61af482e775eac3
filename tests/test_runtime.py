import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is only switched on without CUDA")
@pytest.mark.parametrize("first,warned", [("triton", True), ("torch", False)])
def test_import_order_warning(first, warned):
    # triton's own @jit helpers are built when triton.language is imported: after that, switching to the
    # interpreter leaves them compiled-only and kernels fail with "Cannot call @triton.jit'd outside ..."
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", f"import {first}, llmkernels"], check=False, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert ("triton was imported before llmkernels" in p.stderr) == warned, p.stderr



def test_nan_poisoning_is_on(device, monkeypatch):
    # tests/conftest.py fills llmkernels' own torch.empty allocations with NaN during tests: an op whose kernels
    # write nothing returns NaN, not whatever the memory held (here the plan's launches are skipped)
    from llmkernels import masked_decode
    from llmkernels.ops.masked_decode import kernel
    monkeypatch.setattr(kernel.DecodePlan, "__call__", lambda *a: None)
    q = torch.randn(1, 4, 64, dtype=torch.float16, device=device)
    k = torch.randn(1, 2, 40, 64, dtype=torch.float16, device=device)
    out, lse = masked_decode(q, k, k)
    assert out.isnan().all() and lse.isnan().all()
