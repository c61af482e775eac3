#!/usr/bin/env bash
# Third device call: P/dS-pass sweep (writes bwd_tuned.py), ncu of both passes, then tests, memcheck, check, bench.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cp llmkernels/ops/sparse_mla/bwd_tuned.py /tmp/tuned_before.py
timeout 150 python3 scripts/mla_bwd_sweep.py --write --out /tmp/sweep > "$OUT/sweep.txt" 2>&1; echo "sweep rc=$?"
grep -E "TFLOP|best|TUNED|    [0-9]" "$OUT/sweep.txt"
timeout 70 ncu --clock-control none --kernel-name regex:"_probs_kernel|_grads_kernel" --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
  python3 scripts/sparse_mla_profile.py > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
grep -E "_kernel|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu.txt" | head -30
if cmp -s llmkernels/ops/sparse_mla/bwd_tuned.py /tmp/tuned_before.py; then
  echo "configs unchanged: the committed records stand"; rm -f "$OUT"/info.txt; exit 0
fi
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 7 \
  python3 scripts/mla_bwd_memcheck.py > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.txt"
timeout 200 scripts/gpu.sh sparse_mla_bwd 2>&1 | grep -v "^\[#" | grep -E "passed|failed|FAIL|sparse_mla_bwd  |records"
rm -f "$OUT"/*.png "$OUT"/info.txt
