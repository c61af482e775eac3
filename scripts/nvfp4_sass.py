"""Compile nvfp4_gemv variants for sm_90 WITHOUT a GPU (stand-in driver, as scripts/xl_paged_decode_sass.py) and
report registers (-> resident programs per SM), shared memory, loads, barriers and griddepcontrol placement.

Usage: TRITON_INTERPRET=0 python scripts/nvfp4_sass.py [--dump NAME]  (writes /tmp/nvfp4_<NAME>.sass)
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xl_paged_decode_sass  # noqa: E402,F401  (installs the sm_90 stand-in driver)
import torch  # noqa: E402
import triton  # noqa: E402

from llmkernels.ops.nvfp4_gemv import kernel as K  # noqa: E402

K.pdl_enabled = lambda device: True  # emit griddepcontrol as on Hopper
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")


def compile_cfg(M, Kd, L, cfg):
    captured = {}
    kernels = [K._gemv_kernel, K._gemv_pipe_kernel]
    origs = [k.run for k in kernels]

    def wrap(orig):
        def run(*a, grid, warmup, **kw):
            kw.pop("launch_pdl", None)
            captured["k"] = orig(*a, grid=grid, warmup=True, **kw)
        return run
    for k, o in zip(kernels, origs):
        k.run = wrap(o)
    try:
        a8 = torch.empty(L, M, Kd // 2, dtype=torch.uint8).permute(1, 2, 0)
        b8 = torch.empty(L, 2, Kd // 2, dtype=torch.uint8).permute(1, 2, 0)
        sa8 = torch.empty(L, M, Kd // 16, dtype=torch.uint8).permute(1, 2, 0)
        sb8 = torch.empty(L, 2, Kd // 16, dtype=torch.uint8).permute(1, 2, 0)
        out = torch.empty(L, M, 1, dtype=torch.float16).permute(1, 2, 0)
        K.gemv_launch(a8, b8, sa8, sb8, out, 1.0, cfg=cfg, use_asm=True)
    finally:
        for k, o in zip(kernels, origs):
            k.run = o
    return captured["k"]


def report(name, M, Kd, L, cfg, dump=False):
    k = compile_cfg(M, Kd, L, cfg)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    nw = cfg["num_warps"]
    per_warp = -(-regs * 32 // 256) * 256
    ctas = min(32, 64 // nw, 65536 // (per_warp * nw))
    ops = [m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\d\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)]
    n = lambda pre: sum(o.startswith(pre) for o in ops)  # noqa: E731
    # griddepcontrol.wait in SASS: ACQBULK / "CCTL"? it is emitted as an opaque instruction; count loads before it
    print(f"{name:<44} regs {regs:>3} stack {stack:>3} CTAs/SM {ctas:>2}  LDG {n('LDG'):>3} STS {n('STS'):>2} LDS {n('LDS'):>2} "
          f"BAR {n('BAR'):>2} SHFL {n('SHFL'):>2} PRMT {n('PRMT'):>4} IDP {n('IDP'):>4} instr {len(ops):>5}")
    if dump:
        open(f"/tmp/nvfp4_{name.replace(' ', '_')}.sass", "w").write(sass)
        open(f"/tmp/nvfp4_{name.replace(' ', '_')}.ptx", "w").write(k.asm["ptx"])
    return k


if __name__ == "__main__":
    dump = "--dump" in sys.argv
    for M, Kd, L in ((7168, 2048, 4), (7168, 16384, 1)):
        lay = lambda R, BB, w: dict(BM=K.gemv_tile(BB, R, w), BB=BB, num_warps=w, split=1)  # noqa: E731
        plan = lay(4, 128, 2)  # the H100 plan of both shapes (gemv_plan on the CPU sees 4 SMs)
        cases = [("plan", plan),
                 ("pdl entry pre1", {**plan, "pdl": True, "pre": 1, "trigger": "entry"}),
                 ("pdl entry pre2", {**plan, "pdl": True, "pre": 2, "trigger": "entry"}),
                 ("R4 BB256 4w pdl entry pre1", {**lay(4, 256, 4), "pdl": True, "pre": 1, "trigger": "entry"}),
                 ("pipe2 pdl entry", {**plan, "pipe": 2, "pdl": True, "trigger": "entry"}),
                 ("pipe1 pdl entry", {**plan, "pipe": 1, "pdl": True, "trigger": "entry"}),
                 ("R2 pipe4 pdl entry", {**lay(2, 128, 2), "pipe": 4, "pdl": True, "trigger": "entry"}),
                 ("R4 BB256 4w pipe1 pdl entry", {**lay(4, 256, 4), "pipe": 1, "pdl": True, "trigger": "entry"}),
                 ("R2 BB256 4w pipe2 pdl entry", {**lay(2, 256, 4), "pipe": 2, "pdl": True, "trigger": "entry"})]
        cases += [(f"pipe2 pdl entry maxnreg{n}", {**plan, "pipe": 2, "pdl": True, "trigger": "entry", "maxnreg": n})
                  for n in (56, 64, 72, 80)]
        cases += [(f"R2 pipe4 pdl entry maxnreg{n}", {**lay(2, 128, 2), "pipe": 4, "pdl": True, "trigger": "entry",
                                                       "maxnreg": n}) for n in (48, 56)]
        print(f"-- M={M} K={Kd} L={L}")
        for name, cfg in cases:
            report(name, M, Kd, L, cfg, dump=dump)
