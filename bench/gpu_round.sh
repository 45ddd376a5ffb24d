#!/usr/bin/env bash
# One GPU round: environment, build, the README's test command, compute-sanitizer on the tests that
# stress the ring, the benchmarks, the stress run. Logs, JSON and plots go to $OUT.
# Usage: OUT=/some/dir bash bench/gpu_round.sh [tests] [sanitizer] [bench] [decode] [stress] [quick] [pack]
#   (no stage named: all of them; "quick" shortens the benchmarks; "pack" leaves one round.tgz in $OUT)
#   DECODE_ARGS: the decode loop's arguments (default "--steps 300 --repeats 3": 12 configurations x 31
#   runs, estimated 5 minutes on an H200, most of it at 5 ms; add "--forward-ms 0.2,1" and
#   "--forward-ms 5" to split it over two calls)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The system compiler, whatever CXX the image sets: the image's wrapper builds modules that crash
# formatting numbers in error messages.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}" PYTHONFAULTHANDLER=1
stages="${*:-tests sanitizer bench decode stress pack}"
has() { [[ " $stages " == *" $1 "* ]]; }
quick=""
has quick && quick="--quick"
t0=$(date +%s)
stamp() { echo "[gpu_round $(( $(date +%s) - t0 ))s] $*"; }

{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "cpus: $(nproc)"
  "$CXX" --version | head -n 1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stamp "build"
if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -n 60 "$OUT/build.log"
  exit 1
fi
grep -E "^pinstage setup:|-shared" "$OUT/build.log" | cut -c1-160
# An error message that formats an integer: the toolchain check.
python3 -c "import torch, pinstage
try:
    pinstage.stage_to_device(range(2**61), torch.int64, device='cpu')
except RuntimeError as e:
    print('error path ok:', str(e)[:60])"

if has tests; then
  stamp "tests (the README's test command)"
  bash scripts/test.sh -rfEs --durations=15 -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests exit: $?"
  grep -E "passed|failed|error" "$OUT/tests.log" | tail -n 3
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 40
fi

if has sanitizer; then
  stamp "compute-sanitizer memcheck and synccheck"
  for tool in memcheck synccheck; do
    timeout "${SANITIZER_SECONDS:-150}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stage.py tests/test_fetch.py tests/test_builders_cache.py \
      -k "race_with_overflow or wraps_around or full_ring or stage_into_checks or stage_many_is_one or failed_calls or kernel_matches or held_handle or released_unready" \
      > "$OUT/sanitizer-$tool.log" 2>&1
    echo "$tool exit: $?"
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer-$tool.log" | tail -n 3
  done
fi

if has bench; then
  stamp "microbenchmark"
  python3 bench/microbench.py $quick --json "$OUT/microbench.json" > "$OUT/microbench.log" 2>"$OUT/microbench.err"
  echo "microbench exit: $?"
  sed -n '/^Checks/,$p' "$OUT/microbench.log"
  stamp "builders"
  python3 bench/builders.py $( [ -n "$quick" ] && echo "--repeats 5 --sample-ms 2") --json "$OUT/builders.json" \
    > "$OUT/builders.log" 2>"$OUT/builders.err"
  echo "builders exit: $?"
  cat "$OUT/builders.log"
fi

if has decode; then
  stamp "decode loop"
  python3 bench/decode_loop.py $quick ${DECODE_ARGS:---steps 300 --repeats 3} --json "$OUT/decode_loop.json" \
    > "$OUT/decode_loop.log" 2>"$OUT/decode_loop.err"
  echo "decode loop exit: $?"
  cat "$OUT/decode_loop.log"
  tail -n 20 "$OUT/decode_loop.err"
fi

if has stress; then
  stamp "stress"
  python3 bench/stress.py $quick --json "$OUT/stress.json" > "$OUT/stress.log" 2>&1
  echo "stress exit: $?"
  tail -n 30 "$OUT/stress.log"
fi
stamp "done"
if has pack; then
  tar -C "$OUT" -czf /tmp/round.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/round.tgz "$OUT/"
fi
