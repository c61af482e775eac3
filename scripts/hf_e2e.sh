#!/usr/bin/env bash
# On the GPU machine, from the repo root: tests/test_hf.py on CUDA, then the end-to-end decode benchmark
# (llmkernels.hf.bench). Records are merged into a copy of the committed ones: $OUT/<device>.json is the file to commit.
#   LLMKERNELS_COMMIT=<hash> scripts/hf_e2e.sh [--no-tests] [model ...]   (models: llama-3.1-8b-shaped,
#   llama-3.3-70b-shaped; default both, one process each so the 8B's memory is gone before the 70B is built)
set -uo pipefail
usage() { sed -n '2,5s/^# \{0,1\}//p' "$0"; }
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}
tests=1; models=()
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;; --no-tests) tests=0 ;;
    -*) echo "unknown option $a" >&2; usage >&2; exit 2 ;; *) models+=("$a") ;;
  esac
done
mkdir -p "$OUT"
[ ${#models[@]} = 0 ] && models=(llama-3.1-8b-shaped llama-3.3-70b-shaped)
rc=0
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/hf-info.txt"
if [ $tests = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_hf.py > "$OUT/hf-tests.txt" 2>&1 || rc=1
  tail -15 "$OUT/hf-tests.txt"
fi
slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
[ -f "benchmarks/results/$slug.json" ] && [ ! -f "$OUT/$slug.json" ] && cp "benchmarks/results/$slug.json" "$OUT/"
for m in "${models[@]}"; do
  python3 -m llmkernels.hf.bench --model "$m" --out "$OUT" 2>&1 | tee "$OUT/hf-bench-$m.txt" || rc=1
done
exit $rc
