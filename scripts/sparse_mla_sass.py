"""Compile the Gluon sparse MLA kernels for sm_90 WITHOUT a GPU (stand-in driver) and report registers, spills,
shared memory and instruction counts. Usage: python scripts/sparse_mla_sass.py [dump-dir]"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402


class _FakeDriver(CudaDriver):
    def __init__(self):  # no libcuda here: skip the real init
        pass

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


driver.set_active(_FakeDriver())
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llmkernels.ops.sparse_mla import attn_dist_wgmma as W  # noqa: E402
from llmkernels.ops.sparse_mla import common  # noqa: E402

common.check_same_device = lambda **kw: None  # CPU stand-ins for CUDA tensors


def sass_report(name, k, dump=None):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        bindir = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
        sass = subprocess.run([f"{bindir}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([f"{bindir}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    n = lambda pat: len(re.findall(pat, sass))  # noqa: E731
    print(f"{name:<40} regs {regs.group(1) if regs else '?':>4} stack {stack.group(1) if stack else '?':>4} "
          f"smem {k.metadata.shared:>6} HGMMA {n(r'HGMMA'):>3} LDGSTS {n(r'LDGSTS'):>3} LDL {n(r'LDL'):>3} "
          f"BAR {n(r'BAR.SYNC'):>2} MUFU {n(r'MUFU'):>3}")
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            open(f"{dump}/{name.replace(' ', '_')}.{ext}", "w").write(k.asm[ext])
        open(f"{dump}/{name.replace(' ', '_')}.sass", "w").write(sass)


def ws(name, h_q=128, d_qk=576, dump=None, **cfg):
    s_q, s_kv, topk = 4, 64, 96
    q = torch.empty(s_q, h_q, d_qk, dtype=torch.bfloat16)
    kv = torch.empty(s_kv, 1, d_qk, dtype=torch.bfloat16)
    idx = torch.zeros(s_q, topk, dtype=torch.int32)
    a = common.prepare(q, kv, idx, 0.1, q_start=s_kv - s_q, k_stride=1)
    captured = {}
    orig = W._dist_ws_kernel.run

    def run(*args, grid, warmup, **kw):
        captured["k"] = orig(*args, grid=grid, warmup=True, **kw)
    W._dist_ws_kernel.run = run
    try:
        W.attn_dist_ws_launch(a, torch.empty(s_q, h_q), torch.empty(s_q, topk), config=cfg or None)
    finally:
        W._dist_ws_kernel.run = orig
    sass_report(name, captured["k"], dump)


if __name__ == "__main__":
    dump = sys.argv[1] if len(sys.argv) > 1 else None
    ws("attn_dist ws h128 d576", dump=dump)
    ws("attn_dist ws h64 d576", h_q=64)
    ws("attn_dist ws h128 d512", d_qk=512)
    ws("attn_dist ws h128 d576 2 stages", STAGES=2)


def fwd(name, h_q=128, d_qk=576, dump=None, **cfg):
    from llmkernels.ops.sparse_mla import fwd_wgmma as F
    s_q, s_kv, topk = 4, 64, 96
    q = torch.empty(s_q, h_q, d_qk, dtype=torch.bfloat16)
    kv = torch.empty(s_kv, 1, d_qk, dtype=torch.bfloat16)
    idx = torch.zeros(s_q, topk, dtype=torch.int32)
    a = common.prepare(q, kv, idx, 0.1, q_start=s_kv - s_q, k_stride=1, attn_sink=torch.zeros(h_q))
    captured = {}
    orig = F._fwd_ws_kernel.run

    def run(*args, grid, warmup, **kw):
        captured["k"] = orig(*args, grid=grid, warmup=True, **kw)
    F._fwd_ws_kernel.run = run
    try:
        F.sparse_mla_fwd_ws_launch(a, torch.empty(s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(s_q, h_q),
                                   torch.empty(s_q, h_q), config=cfg or None)
    finally:
        F._fwd_ws_kernel.run = orig
    sass_report(name, captured["k"], dump)
