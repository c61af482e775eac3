#!/usr/bin/env bash
# On the GPU machine, from the repo root: tests, `llmkernels check`, memcheck and benchmarks. Results land in $OUT.
#   scripts/gpu.sh [--no-tests] [--no-bench] [--quick] [--memcheck] [op ...]
# Tests run for the named ops (tests/test_<op>*.py, or all when none is named), then `llmkernels check`; --memcheck
# runs scripts/memcheck.py under compute-sanitizer (its groups that match the named ops, or all); benchmarks append to
# a copy of the committed records, so $OUT/<device>.json is the full, merged file to commit.
# The GPU machine gets the tree without .git: pass LLMKERNELS_COMMIT=<hash> so records name their commit.
set -uo pipefail
usage() { sed -n '2,7s/^# \{0,1\}//p' "$0"; }
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}
tests=1; bench=1; quick=""; memcheck=0; ops=()
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    --no-tests) tests=0 ;; --no-bench) bench=0 ;; --quick) quick="--quick" ;; --memcheck) memcheck=1 ;;
    -*) echo "unknown option $a" >&2; usage >&2; exit 2 ;;
    *) ops+=("$a") ;;
  esac
done
mkdir -p "$OUT"
rc=0
python3 -m llmkernels.cli info 2>&1 | tee "$OUT/info.txt"
if [ $tests = 1 ]; then
  files=(); for o in "${ops[@]}"; do for f in tests/test_"$o"*.py; do [ -e "$f" ] && files+=("$f"); done; done
  [ ${#ops[@]} = 0 ] && files=(tests)
  # every test, not only the gpu-marked ones: the CPU-style tests then run on CUDA tensors (other code paths)
  python3 -m pytest -q -p no:cacheprovider "${files[@]}" > "$OUT/gpu-tests.txt" 2>&1 || rc=1
  tail -25 "$OUT/gpu-tests.txt"
  python3 -m llmkernels.cli check "${ops[@]}" 2>&1 | tee "$OUT/check.txt" || rc=1
fi
if [ $memcheck = 1 ]; then
  groups=(); for o in "${ops[@]}"; do
    case "$o" in
      sparse_mla_fwd|sparse_mla_attn_dist|sparse_mla) groups+=(sparse_mla sparse_mla_gluon) ;;
      sparse_mla_bwd|xl_paged_decode) groups+=("$o") ;;
    esac
  done
  if [ ${#ops[@]} = 0 ] || [ ${#groups[@]} -gt 0 ]; then
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 7 \
      python3 scripts/memcheck.py "${groups[@]}" > "$OUT/memcheck.txt" 2>&1 || rc=1
    grep -E "ERROR SUMMARY|memcheck script" "$OUT/memcheck.txt"
  fi
fi
if [ $bench = 1 ]; then
  slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
  [ -f "benchmarks/results/$slug.json" ] && cp "benchmarks/results/$slug.json" "$OUT/"
  python3 -m llmkernels.cli bench $quick --out "$OUT" "${ops[@]}" 2>&1 | tee "$OUT/bench.txt" || rc=1
fi
exit $rc
