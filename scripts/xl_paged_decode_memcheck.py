"""Small xl_paged_decode run for `compute-sanitizer --tool memcheck` (set PYTORCH_NO_CUDA_MEMORY_CACHING=1
so every tensor is its own allocation and an over-read is caught at its exact end).

Tables hold garbage past the used blocks (huge and negative ids), used blocks with out-of-range ids, a
context longer than the table span and a bd narrower than the context: nothing may be read out of bounds,
and the result must match the reference (which skips the same tokens). Exits 1 on a mismatch.
"""
import sys

import torch

from llmkernels.checking import rel_err
from llmkernels.ops.xl_paged_decode.spec import OUT_TOL, make_inputs, ref, run

ok = True
for layout, H, Hkv in (("nhd", 8, 4), ("legacy", 8, 4), ("nhd", 4, 4), ("legacy", 4, 4)):  # GQA and MHA paths
    for dtype, D, bs in ((torch.float16, 128, 16), (torch.float32, 80, 8)):
        x = make_inputs(4, H, Hkv, D, bs, [70, 5, 0, 40], layout, dtype, "cuda", bd="contig", table_pad=2,
                        extra_blocks=0, garbage=True)
        nb = x["k_cache"].shape[0]
        x["block_tables"][0, 1] = nb              # just past the last block
        x["block_tables"][0, 3] = -1
        x["block_tables"][3, 0] = 2 ** 31 - 1
        x["context_lens"][1] = 10 ** 6            # clamped to the table span
        x["bd"] = x["bd"][:, :, :36].contiguous()  # narrower than context 70 and 40: clamped to 36
        torch.cuda.synchronize()
        o, lse = run(x, return_lse=True)
        torch.cuda.synchronize()
        err = rel_err(o, ref(x)[0])
        good = err <= OUT_TOL[dtype]
        ok &= good
        print(f"memcheck case {layout} H={H} Hkv={Hkv} {str(dtype)[6:]} D={D} bs={bs}: err {err:.2e} {'OK' if good else 'MISMATCH'}")
print("memcheck script:", "all OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
