#!/usr/bin/env bash
# On the GPU machine: sparse_mla tests, memcheck, check, config sweep and benchmark records, all into $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
steps=${*:-tests memcheck check tune bench}
for s in $steps; do case $s in
  tests) timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sparse_mla_fwd.py > "$OUT/gpu-tests.txt" 2>&1
         echo "tests rc=$?"; tail -4 "$OUT/gpu-tests.txt" ;;
  memcheck) PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
              python3 scripts/sparse_mla_memcheck.py > "$OUT/memcheck.txt" 2>&1
            echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|all memcheck" "$OUT/memcheck.txt" ;;
  check) timeout 120 python3 -m llmkernels.cli check sparse_mla_fwd > "$OUT/check.txt" 2>&1; echo "check rc=$?"
         grep -E "FAIL|passed" "$OUT/check.txt" ;;
  tune*) timeout 240 python3 scripts/sparse_mla_tune.py ${s#tune} > "$OUT/tune.txt" 2>&1; echo "tune rc=$?"
         grep -v "^\s*$" "$OUT/tune.txt" | tail -40 ;;
  bench) timeout 200 python3 -m llmkernels.cli bench --quick --out "$OUT" sparse_mla_fwd sparse_mla_attn_dist \
           > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"; tail -12 "$OUT/bench.txt" ;;
esac; done
