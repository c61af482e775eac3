#!/usr/bin/env bash
# Device run for the nvfp4 GEMV work: the sweep, then an ncu profile of the old and the mma kernel at one shape.
# Usage (repo root, on the device): LLMKERNELS_COMMIT=<hash> scripts/nvfp4_device.sh [sweep budget s]
set -u
export PYTHONPATH=$PWD:$PWD/scripts PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python scripts/nvfp4_mma_sweep.py "${1:-200}" 2>&1 | tee "$OUT/sweep_log.txt" | grep -v "^   .* us "
[ "${NCU:-0}" = 1 ] || exit 0
SECTIONS="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy"
for kind in old mma; do
  NVFP4_KIND=$kind timeout 120 ncu -k regex:_gemv --launch-skip 2 --launch-count 1 $SECTIONS --print-details all \
    python scripts/nvfp4_profile.py > "$OUT/ncu_$kind.txt" 2>&1
  echo "== ncu $kind"; grep -E "Duration|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall" "$OUT/ncu_$kind.txt" | head -40
done
