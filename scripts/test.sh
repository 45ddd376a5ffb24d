#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the tests. CUDA tests skip
# cleanly where no GPU is visible. Extra arguments go to pytest: paths (tests/test_x.py,
# tests/test_x.py::test_y) replace the whole suite, options (-k, -m, -x) apply to it.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Without a GPU the tests spread over the cores (where pytest-xdist is installed); with one they run
# in one process, as the CUDA tests' checks that a kernel is still running assume a quiet GPU.
if "$PY" -c "import sys, torch, xdist; sys.exit(1 if torch.cuda.is_available() else 0)" 2>/dev/null; then
  set -- -n "$(nproc)" "$@"
fi
# No path given: pytest runs pyproject's testpaths (tests/) from the checkout's root (env.sh cd's there).
exec "$PY" -m pytest -q "$@"
