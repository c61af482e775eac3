"""nvfp4_linear at the record shapes (bf16, T 1 / 4 / 16) with the prmt table words as immediates (shipped: ptxas copies
them before each prmt) or, with NVFP4_LUT=reg, in registers; checked against the reference, timed as the
harness times them (notes/nvfp4_gemv.md, round 11). Run it once per setting, interleaved."""
import os

import torch
import triton.language as tl

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4_gemv import kernel as K
from llmkernels.ops.nvfp4_gemv.op import nvfp4_linear
from llmkernels.ops.nvfp4_gemv.reference import nvfp4_linear_ref
from llmkernels.ops.nvfp4_gemv.spec import LINEAR_SHAPES, LINEAR_TOKENS, LINEAR_TOL, linear_bytes, make_linear_inputs

if os.environ.get("NVFP4_LUT") == "reg":  # la and ha (prmt's register operands) ORed with the kernel's opaque zero
    _tables = K._tables

    def _reg_tables(bf16):
        moves = _tables(bf16).splitlines(keepends=True)  # la, lb, ha, hb
        la, ha = (m.split(", ")[1].rstrip(";\n") for m in (moves[0], moves[2]))
        return K.opaque_zero("la", "ha") + f"or.b32 ha, la, {ha};\nor.b32 la, la, {la};\n" + moves[1] + moves[3]
    K._tables = _reg_tables
    K.ASM_MMA_BF16, K.ASM_MMA_F16 = tl.constexpr(K._asm_mma(True)), tl.constexpr(K._asm_mma(False))
    K.ASM_MMA2_BF16, K.ASM_MMA2_F16 = tl.constexpr(K._asm_mma(True, 2)), tl.constexpr(K._asm_mma(False, 2))
    K.ASM_W16_BF16, K.ASM_W16_F16 = tl.constexpr(K._asm_w16(True)), tl.constexpr(K._asm_w16(False))
bw = copy_bandwidth()
dev = torch.device("cuda")
cells = []
for N, Kd in LINEAR_SHAPES:
    for T in LINEAR_TOKENS:
        nb = linear_bytes(T, N, Kd)
        sets = rotation_sets(nb)
        xs = [make_linear_inputs(T, N, Kd, torch.bfloat16, dev, bias=False) for _ in range(sets)]
        x = xs[0]
        err = rel_err(nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"]),
                      nvfp4_linear_ref(x["x"], x["packed"], x["scales"], x["gs"]))
        assert err <= LINEAR_TOL[torch.bfloat16], err
        ms = _graph_time_ms([lambda x=x: nvfp4_linear(x["x"], x["packed"], x["scales"], x["gs"]) for x in xs])
        cells.append(f"T={T} {N}x{Kd} {100 * nb / bw / (ms * 1e-3):.1f}%")
print(os.environ.get("NVFP4_LUT", "imm"), "  ".join(cells), flush=True)
