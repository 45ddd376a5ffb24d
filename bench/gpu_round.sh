#!/usr/bin/env bash
# One GPU round in one call: environment, build, the README's test command, the benchmarks. Each
# stage has a time box, so that a short lease still brings back what finished. Logs, JSON and plots
# go to $OUT.
# Usage: OUT=/some/dir bash bench/gpu_round.sh [tests] [collect] [sanitizer] [bench] [engines] [decode] [stress] [quick] [pack]
#   or any one benchmark by name (microbench, static_inputs, prefill_copy, overflow_blocks, builders, vllm_host,
#   sglang_host, sglang_loop, vllm_loop, row_writes, prep_split; "decode" runs prep_split too)
#   (no stage named: tests bench engines decode pack; "quick" shortens the benchmarks; "pack"
#   leaves one round.tgz in $OUT, as a lease may bring back only a few files)
#   tests: exactly the README's test command (bash scripts/test.sh), whole, detached; its summary line goes to
#   $OUT/tests.txt. Engine code (SGLang, vLLM) is read from .engines/ (carry it: nothing downloads there).
#   TESTS_SECONDS, BENCH_SECONDS (each benchmark), LOOP_SECONDS (each engine loop), DECODE_SECONDS,
#   SANITIZER_SECONDS (each tool of SANITIZER_TOOLS, default "memcheck synccheck"): the time boxes;
#   DECODE_ARGS: the decode loop's arguments (default "--steps 300 --repeats 3", about 6 minutes; its JSON
#   is rewritten after each configuration, "complete": false until the last, so a time box keeps those done);
#   MICROBENCH_ARGS: more microbenchmark arguments (e.g. "--repeats 9"); PREP_SPLIT_ARGS: prep_split's
#   (default bs 64, 0.2 ms forward).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# The system compiler, whatever CXX the image sets: the image's wrapper builds modules that crash
# formatting numbers in error messages.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
stages="${*:-tests bench engines decode pack}"
has() { [[ " $stages " == *" $1 "* ]]; }
quick=""
has quick && quick="--quick"
t0=$(date +%s)
stamp() { echo "[gpu_round $(( $(date +%s) - t0 ))s] $*"; }
# Runs a command under a time box, output to $OUT/<name>.log; says how it ended.
boxed() {
  local name="$1" seconds="$2"; shift 2
  timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "$name: stopped by its ${seconds}s time box" || echo "$name exit: $rc"
  return $rc
}
summary() { grep -E "passed|failed|error" "$OUT/$1.log" | tail -n 3; grep -E "^(FAILED|ERROR)" "$OUT/$1.log" | head -n 40; }

{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The tree a lease carries may sit on a stale .git: the caller can name the commit it sent.
  echo "commit: ${PINSTAGE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "cpus: $(nproc)"
  "${CXX:-c++}" --version | head -n 1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# Nothing downloads on the GPU machine: without carried engine sources the engine tests skip and the
# engine benchmarks fail, so say it before any time is spent.
for engine in sglang vllm; do
  ls -d .engines/"$engine"-* > /dev/null 2>&1 ||
    echo "WARNING: no .engines/$engine-* carried: its tests skip, its benchmarks fail (python -m bench.engines.${engine}_stubs, then carry .engines)"
done

# Wheels carried in .whl (pytest-xdist and execnet: the tests that need no GPU spread over the cores).
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
stamp "build"
if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -n 60 "$OUT/build.log"
  exit 1
fi
grep -E "^pinstage setup:" "$OUT/build.log" | cut -c1-160

# The test command can outlast one device call: it runs detached (setsid), and "collect" in a later
# call on the same machine waits for the rest. It runs in a copy of the tree (built module and
# carried engines included): a later call carries the tree afresh, and files rewritten under a
# running session fail its tests (a test's source or vLLM's metadata briefly missing).
log=/tmp/pinstage-tests.log
snapshot=/tmp/pinstage-tests-tree
pidfile=/tmp/pinstage-tests.pid
if has tests && [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "tests: an earlier call's run is still going; not starting another (it would remove its tree)"
elif has tests; then
  stamp "the README's test command, detached, in a copy of the tree: bash scripts/test.sh"
  rm -rf "$log" "$snapshot" && cp -a . "$snapshot"
  setsid nohup bash -c "cd $snapshot && bash scripts/test.sh > $log 2>&1; echo \"test command exit: \$?\" >> $log" \
    > /dev/null 2>&1 &
  echo $! > "$pidfile"
fi
if has tests || has collect; then
  end=$(( $(date +%s) + ${TESTS_SECONDS:-540} ))
  # Copied on each look, so that a lease cut short still brings back how far the tests got.
  until grep -q "^test command exit:" "$log" 2>/dev/null || [ "$(date +%s)" -ge "$end" ]; do
    cp "$log" "$OUT/tests.log" 2>/dev/null
    sleep 5
  done
  cp "$log" "$OUT/tests.log" 2>/dev/null
  if grep -q "^test command exit:" "$log"; then
    summary tests
    { echo "commit: ${PINSTAGE_COMMIT:-unknown}  command: bash scripts/test.sh"
      grep -E "(passed|failed|error).* in [0-9.]+s" "$log" | tail -n 3; grep -E "^(FAILED|ERROR)" "$log"; } > "$OUT/tests.txt"
  else
    echo "tests: still running after the time box; run this script's \"collect\" stage in the next call"
  fi
fi
if has sanitizer && [ -f "$log" ] && ! grep -q "^test command exit:" "$log"; then
  echo "sanitizer: skipped, the test command is still running (it would share the GPU)"
elif has sanitizer; then
  stamp "compute-sanitizer: ${SANITIZER_TOOLS:-memcheck synccheck}"
  for tool in ${SANITIZER_TOOLS:-memcheck synccheck}; do
    timeout "${SANITIZER_SECONDS:-150}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stage.py tests/test_fetch.py tests/test_builders_cache.py tests/test_builders_prefill.py tests/test_static_inputs_rows.py \
      -k "race_with_overflow or wraps_around or full_ring or stage_into_checks or stage_many_is_one or failed_calls or kernel_matches or held_handle or released_unready or eight_steps_of_writes or every_element_size or distinct_rows_short or cache_rows_behind_a_busy_stream or odd_sizes_and_megabytes" \
      > "$OUT/sanitizer-$tool.log" 2>&1
    echo "$tool exit: $?"
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer-$tool.log" | tail -n 3
  done
fi

b="${BENCH_SECONDS:-120}"
# "bench" names the five host benchmarks below, "engines" the five that run engine code.
has bench && stages="$stages microbench static_inputs prefill_copy overflow_blocks builders"
has engines && stages="$stages vllm_host sglang_host sglang_loop vllm_loop row_writes"
if has microbench; then
  stamp "microbenchmark"
  boxed microbench "$b" python3 bench/microbench.py $quick ${MICROBENCH_ARGS:-} --json "$OUT/microbench.json"
  sed -n '/^Driver calls/,/^$/p;/^Checks/,$p' "$OUT/microbench.log"
fi
if has static_inputs; then
  stamp "StaticInputs"
  boxed static_inputs "$b" python3 bench/static_inputs.py $quick --json "$OUT/static_inputs.json"
  tail -n 25 "$OUT/static_inputs.log"
fi
if has prefill_copy; then
  stamp "stage_prefill's one launch against a copy and a launch"
  boxed prefill_copy "$b" python3 bench/prefill_copy.py --json "$OUT/prefill_copy.json"
  tail -n 20 "$OUT/prefill_copy.log"
fi
if has overflow_blocks; then
  stamp "overflow blocks"
  boxed overflow_blocks "$b" python3 bench/overflow_blocks.py $( [ -n "$quick" ] && echo "--repeats 7") --json "$OUT/overflow_blocks.json"
  tail -n 12 "$OUT/overflow_blocks.log"
fi
if has builders; then
  stamp "builders"
  boxed builders "$b" python3 bench/builders.py $( [ -n "$quick" ] && echo "--repeats 5 --sample-ms 2") --json "$OUT/builders.json"
  cat "$OUT/builders.log"
fi
if has vllm_host; then
  stamp "vLLM's staging helpers"
  boxed vllm_host "$b" python3 bench/vllm_host.py --json "$OUT/vllm_host.json"
  tail -n 40 "$OUT/vllm_host.log"
fi
if has sglang_host; then
  stamp "SGLang's replaced functions"
  boxed sglang_host "$b" python3 bench/sglang_host.py --json "$OUT/sglang_host.json" --plot "$OUT/sglang_host.png"
  tail -n 30 "$OUT/sglang_host.log"
fi
for loop in sglang_loop vllm_loop row_writes; do
  if has "$loop" && [ -f "bench/$loop.py" ]; then
    stamp "$loop"
    boxed "$loop" "${LOOP_SECONDS:-240}" python3 "bench/$loop.py" $quick --out "$OUT"
    tail -n 30 "$OUT/$loop.log"
  fi
done
if has decode; then
  stamp "decode loop"
  boxed decode_loop "${DECODE_SECONDS:-480}" python3 bench/decode_loop.py $quick ${DECODE_ARGS:---steps 300 --repeats 3} \
    --json "$OUT/decode_loop.json"
  tail -n 40 "$OUT/decode_loop.log"
fi
if has decode || has prep_split; then
  stamp "the decode loop's host prep, call by call"
  boxed prep_split "$b" python3 bench/prep_split.py ${PREP_SPLIT_ARGS:-} --json "$OUT/prep_split.json"
  tail -n 16 "$OUT/prep_split.log"
fi
if has stress; then
  stamp "stress"
  boxed stress "${STRESS_SECONDS:-300}" python3 bench/stress.py $quick --json "$OUT/stress.json"
  tail -n 30 "$OUT/stress.log"
fi
stamp "done"
if has pack; then
  tar -C "$OUT" -czf /tmp/round.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/round.tgz "$OUT/"
fi
