#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the tests. CUDA tests skip
# cleanly where no GPU is visible. Extra arguments go to pytest: paths (tests/test_x.py,
# tests/test_x.py::test_y) replace the whole suite, options (-k, -m, -x) apply to it.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Without a GPU the tests spread over the cores (where pytest-xdist is installed). With one and no
# arguments, three runs: the tests that need neither a GPU nor its absence (spread over the cores),
# the no_gpu tests with CUDA hidden (code that picks its kernels by platform takes its CPU path), then
# the CUDA tests in one process, as their checks that a kernel is still running assume a quiet GPU.
# Given arguments on a GPU machine, one run: its no_gpu tests skip, saying so.
gpu=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
xdist=$("$PY" -c "import xdist" 2>/dev/null && echo 1 || echo 0)
if [ "$gpu" = 0 ] && [ "$xdist" = 1 ]; then
  set -- -n "$(nproc)" "$@"
fi
if [ "$gpu" = 0 ] || [ $# -gt 0 ]; then
  exec "$PY" -m pytest -q --durations=15 "$@"
fi
spread=()
[ "$xdist" = 1 ] && spread=(-n "$(( $(nproc) < 8 ? $(nproc) : 8 ))")
"$PY" -m pytest -q --durations=15 -m "not cuda and not no_gpu" "${spread[@]}" && rest=0 || rest=$?
CUDA_VISIBLE_DEVICES= "$PY" -m pytest -q -m no_gpu "${spread[@]}" && hidden=0 || hidden=$?
"$PY" -m pytest -q --durations=15 -m cuda && cuda=0 || cuda=$?
for code in $rest $hidden $cuda; do [ "$code" = 0 ] || exit "$code"; done
