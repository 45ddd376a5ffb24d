#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the tests. CUDA tests skip
# cleanly where no GPU is visible. Extra arguments go to pytest: paths (tests/test_x.py,
# tests/test_x.py::test_y) replace the whole suite, options (-k, -m, -x) apply to it.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Without a GPU the tests spread over the cores (where pytest-xdist is installed). With one, the CUDA
# tests run in one process, as their checks that a kernel is still running assume a quiet GPU; given
# no arguments and pytest-xdist, the other tests run first, spread over the cores.
gpu=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
xdist=$("$PY" -c "import xdist" 2>/dev/null && echo 1 || echo 0)
if [ "$xdist" = 1 ] && [ "$gpu" = 0 ]; then
  set -- -n "$(nproc)" "$@"
elif [ "$xdist" = 1 ] && [ $# -eq 0 ]; then
  "$PY" -m pytest -q --durations=15 -m "not cuda" -n "$(( $(nproc) < 8 ? $(nproc) : 8 ))" && rest=0 || rest=$?
  "$PY" -m pytest -q --durations=15 -m cuda && cuda=0 || cuda=$?
  exit $(( rest != 0 ? rest : cuda ))
fi
exec "$PY" -m pytest -q --durations=15 "$@"
