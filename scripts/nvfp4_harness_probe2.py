"""Follow-up of nvfp4_harness_probe.py: the public op in a 64-call graph read 81 % against 87.6 % for gemv_launch.
Alternates op64 / raw64 / checked64 (validation + gemv_launch, no custom op) / direct64 (torch.ops...nvfp4_gemv_out);
dumps the captured graphs of 3 calls (op and raw) and prints their node and edge kinds."""
import os
import re
import tempfile

import torch

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms, rotation_sets
from llmkernels.ops.nvfp4_gemv import op as O
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch
from llmkernels.ops.nvfp4_gemv.spec import gemv_bytes, make_inputs

dev = torch.device("cuda")
bw = copy_bandwidth()
M, K, L = 7168, 2048, 4
floor_us = gemv_bytes(M, K, L) / bw * 1e6
sets = rotation_sets(gemv_bytes(M, K, L))
xs = [make_inputs(M, K, L, dev) for _ in range(sets)]
u8 = lambda x: [x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb")]  # noqa: E731
ways = {
    "op": [lambda x=x: O.nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"], static_weights=True) for x in xs],
    "raw": [lambda x=x: gemv_launch(*u8(x), x["c"], 1.0, static_weights=True) for x in xs],
    "checked": [lambda x=x: (O._check_gemv(x["a"], x["b"], x["sfa"], x["sfb"], x["c"]),
                             gemv_launch(*u8(x), x["c"], 1.0, static_weights=True)) for x in xs],
    "direct": [lambda x=x: torch.ops.llmkernels.nvfp4_gemv_out(x["a"], x["b"], x["sfa"], x["sfb"], 1.0, x["c"], True)
               for x in xs],
}
for rnd in range(3):
    print(f"round {rnd}: " + "  ".join(f"{k}64 {100 * floor_us / (_graph_time_ms(f, calls=64) * 1e3):5.1f} %"
                                      for k, f in ways.items()), flush=True)
for name in ("op", "raw"):
    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for j in range(3):
                ways[name][j]()
    torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), f"{name}.dot")
    g.debug_dump(path)
    dot = open(path).read()
    kinds = re.findall(r'label="[{]?(\w+)', dot)
    print(f"{name}: {len(dot)} chars; node labels {sorted(set(kinds))[:12]}; kernels "
          f"{dot.count('KERNEL')}; programmatic {dot.lower().count('programmatic')}; edges {dot.count('->')}")
    for line in dot.splitlines():
        if "->" in line:
            print("   ", line.strip()[:160])
    if os.environ.get("OUT"):
        open(os.path.join(os.environ["OUT"], f"{name}.dot"), "w").write(dot)
