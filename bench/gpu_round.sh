#!/usr/bin/env bash
# One GPU round on a machine with a CUDA GPU: environment, build, every test (CUDA included), the
# microbenchmark and the builders benchmark, with logs and JSON under $OUT (default bench/out/gpu).
# Usage: OUT=/some/dir GIT_REV=<commit> bash bench/gpu_round.sh
# GIT_REV: take it where the commit was made; a copied working tree can carry stale git metadata.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${GIT_REV:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc
  echo "CXX=${CXX:-unset} CC=${CC:-unset}"
  "${CXX:-c++}" --version | head -n 1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

start=$(date +%s)
# Build through the README's set-up, then one pytest process per test file, so that a crash in
# one file cannot hide the results of the others.
( source scripts/env.sh
  set +e  # env.sh turns on errexit; a failing test file must not end the loop
  for case in python_fallback_error c10_value_error c10_type_error cache_index_error cuda_fallback_error; do
    "$PY" bench/error_probe.py "$case"; rc=$?
    echo "=== probe $case exit $rc"
    if [ "$rc" -ge 128 ] && command -v cuda-gdb >/dev/null; then
      cuda-gdb -batch -ex run -ex bt --args "$PY" bench/error_probe.py "$case" 2>&1 | grep -E "^#" | head -n 25
    fi
  done
  for f in tests/test_*.py; do
    echo "=== $f"
    # Whole output: a failure's traceback must survive into the log.
    "$PY" -X faulthandler -m pytest -q -rfEs --tb=short "$f" 2>&1 | grep -v "^[.sx]* *\[ *[0-9]*%\]$"
    echo "=== $f exit ${PIPESTATUS[0]}"
  done ) > "$OUT/tests.log" 2>&1
grep -E "^=== .* exit|passed|failed|error" "$OUT/tests.log"
echo "tests took $(( $(date +%s) - start )) s"

bash scripts/bench.sh 2>&1 | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
cp bench/out/microbench.json bench/out/builders.json "$OUT/" 2>/dev/null || true
