#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the benchmarks: the staging
# microbenchmark against its peers, the builders, and with a GPU a short decode loop. Without a GPU,
# the CPU (conversion) part. JSON and plots go to bench/out/. Extra arguments go to microbench.py.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
mkdir -p bench/out
"$PY" bench/microbench.py --json bench/out/microbench.json "$@"
"$PY" bench/builders.py --json bench/out/builders.json
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$PY" bench/decode_loop.py --quick --json bench/out/decode_loop.json
fi
