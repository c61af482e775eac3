"""Compile xl_paged_decode's split kernel for sm_90 WITHOUT a GPU and report what matters for speed.

Runs on a CPU-only machine: a stand-in Triton driver answers 'sm_90' so the real JIT specialisation
(divisibility, unit strides) is used. Prints registers, spills, shared memory, the width of global
loads and whether loads became cp.async. Usage: TRITON_INTERPRET=0 python scripts/xl_paged_decode_sass.py [--v4 | nhd|legacy (dump its ttgir)]
"""
import re
import sys

import sm90_offline as O  # noqa: I100  (installs the sm_90 stand-in driver first)
import torch

from llmkernels.ops.xl_paged_decode import kernel as K  # noqa: E402


def report(name, layout, dtype=torch.float16, D=128, bs=16, H=16, Hkv=16, **cfg):
    esize = torch.tensor([], dtype=dtype).element_size()
    K.combine = lambda *a: None

    def launch():
        S, nb, x = 2, 64, 16 // esize
        q = torch.empty(S, H, D, dtype=dtype)
        if layout == "legacy":
            kc = torch.empty(nb, Hkv, D // x, bs, x, dtype=dtype)
            vc = torch.empty(nb, Hkv, D, bs, dtype=dtype)
        else:
            kc = torch.empty(nb, bs, Hkv, D, dtype=dtype)
            vc = torch.empty(nb, bs, Hkv, D, dtype=dtype)
        bt = torch.zeros(S, 32, dtype=torch.int32)
        cl = torch.zeros(S, dtype=torch.int32)
        u = torch.empty(H, D, dtype=dtype)
        bd = torch.empty(S, H, 32 * bs, dtype=dtype)
        K.xl_paged_decode_fwd(q, kc, vc, bt, cl, u, bd, 0.1, q, torch.empty(S, H), config=cfg or None)
    k = O.compiled(K._split_kernel, launch)
    ttgir = k.asm["ttgir"]
    sass, res = O.sass(k)
    regs, stack = O.regs_stack(res)
    loads = {w: len(re.findall(rf"LDG\.E\.{w}\b", sass)) for w in ("128", "64")}
    loads["32"] = len(re.findall(r"LDG\.E(?:\.CONSTANT)?\s", sass)) + len(re.findall(r"LDG\.E\.(?:U16|16)", sass))
    ldgsts = len(re.findall(r"LDGSTS", sass))
    print(f"{name:<34} regs {regs:>4} stack {stack:>4} "
          f"smem {k.metadata.shared:>6}  LDG.128 {loads['128']:>3} LDG.64 {loads['64']:>3} LDG<=32 {loads['32']:>3} "
          f"LDGSTS {ldgsts:>3}  async_copy(ttgir) {ttgir.count('async_copy_global_to_local'):>2} "
          f"mma {'v2' if 'HMMA' in sass else ''}{'v3' if 'HGMMA' in sass else ''}")
    return k


def v4_variants():
    """The v4 candidates (mha_path / legacy_k) next to v2 at the bench config and a few tile/warp choices."""
    for layout in ("nhd", "legacy"):
        for cfg in ({}, {"mha_path": "reduce"}, {"mha_path": "reduce", "block_n": 128},
                    {"mha_path": "reduce", "block_n": 32}, {"mha_path": "reduce", "num_warps": 8},
                    {"mha_path": "reduce", "num_stages": 3}, {"mha_path": "reduce", "block_n": 128, "num_warps": 8}):
            report(f"{layout} fp16 D128 bs16 {cfg}", layout, **cfg)
        report(f"{layout} fp16 D128 bs16 reduce+prefetch_table", layout, mha_path="reduce", prefetch_table=True)
    report("legacy fp16 D128 bs16 G=8 v2", "legacy", H=16, Hkv=2)
    report("legacy fp16 D128 bs16 G=8 native", "legacy", H=16, Hkv=2, legacy_k="native")
    report("legacy fp16 D128 bs16 G=1 native(dot)", "legacy", legacy_k="native")
    report("legacy fp16 D80 bs16 reduce", "legacy", D=80, mha_path="reduce")
    report("legacy fp32 D96 bs256 reduce", "legacy", dtype=torch.float32, D=96, bs=256, mha_path="reduce")
    report("nhd bf16 D256 bs8 reduce", "nhd", dtype=torch.bfloat16, D=256, bs=8, mha_path="reduce")


if __name__ == "__main__" and "--v4" in sys.argv:
    v4_variants()
elif __name__ == "__main__":
    for layout in ("nhd", "legacy"):
        for cfg in ({}, {"block_n": 128}, {"block_n": 32}, {"num_warps": 8}):
            report(f"{layout} fp16 D128 bs16 {cfg}", layout, **cfg)
    report("legacy fp16 D80 bs16", "legacy", D=80)
    report("nhd bf16 D256 bs8", "nhd", dtype=torch.bfloat16, D=256, bs=8)
    report("legacy fp32 D96 bs256", "legacy", dtype=torch.float32, D=96, bs=256)
    report("legacy fp16 D128 bs16 G=8", "legacy", H=16, Hkv=2)
    if len(sys.argv) > 1:
        k = report("dump", sys.argv[1])
        open("/tmp/xl.ttgir", "w").write(k.asm["ttgir"])


def histogram(k):
    sass = O.sass(k)[0]
    from collections import Counter
    return Counter(m.group(1) for m in re.finditer(r"\b((?:LDG|LDGSTS|LDS|STS|LDSM|STG|LDL|STL)[\.\w]*)", sass)), sass
