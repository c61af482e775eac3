#!/usr/bin/env bash
# One device call for sparse_mla_bwd: config sweep, GPU tests + check + bench (scripts/gpu.sh), memcheck.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ "${SWEEP:-1}" = 1 ]; then
  timeout 240 python3 scripts/mla_bwd_sweep.py --write --out /tmp/sweep 2>&1 | tee "$OUT/sweep.txt" | grep -v "^   "
fi
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 7 \
  python3 scripts/mla_bwd_memcheck.py > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|det=" "$OUT/memcheck.txt" | tail -7
timeout 300 scripts/gpu.sh sparse_mla_bwd 2>&1 | grep -v "^\[#" | tail -30
rm -f "$OUT"/*.png
