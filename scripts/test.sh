#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the tests. CUDA tests skip
# cleanly where no GPU is visible. Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PY" -m pytest -q tests "$@"
