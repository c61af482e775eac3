#!/usr/bin/env bash
# One device call for xl_paged_decode: GPU tests + memcheck (in parallel), check, tuning sweep, bench.
#   OUT=$OUT scripts/xl_paged_decode_device.sh [--no-sweep] [--no-tests]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
sweep=1; tests=1
for a in "$@"; do case "$a" in --no-sweep) sweep=0 ;; --no-tests) tests=0 ;; esac; done
rc=0
python3 -m llmkernels.cli info 2>&1 | tee "$OUT/info.txt"
if [ $tests = 1 ]; then
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
      python3 scripts/xl_paged_decode_memcheck.py > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.txt" ) &
  mc=$!
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_xl_paged_decode.py > "$OUT/gpu-tests.txt" 2>&1 || rc=1
  python3 -m llmkernels.cli check xl_paged_decode >> "$OUT/gpu-tests.txt" 2>&1 || rc=1
  wait $mc
  tail -4 "$OUT/memcheck.txt"; grep -q "memcheck rc=0" "$OUT/memcheck.txt" || rc=1
  tail -15 "$OUT/gpu-tests.txt"
fi
[ $sweep = 1 ] && { python3 scripts/xl_paged_decode_sweep.py > "$OUT/sweep.txt" 2>&1 || rc=1; tail -6 "$OUT/sweep.txt"; }
slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
[ -f "benchmarks/results/$slug.json" ] && cp "benchmarks/results/$slug.json" "$OUT/"
python3 -m llmkernels.cli bench --out "$OUT" xl_paged_decode > "$OUT/bench.txt" 2>&1 || rc=1
grep -v '^\[#\|^\r' "$OUT/bench.txt" | tail -16
exit $rc
