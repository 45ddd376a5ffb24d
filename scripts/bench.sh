#!/usr/bin/env bash
# Sets up (first run only), builds pinstage._C if stale, and runs the benchmarks: the staging
# microbenchmark against its peers, then the builders. Without a GPU, the CPU (conversion) part.
# Results: bench/out/*.json. Extra arguments go to bench/microbench.py.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
mkdir -p bench/out
"$PY" bench/microbench.py --json bench/out/microbench.json "$@"
"$PY" bench/builders.py --json bench/out/builders.json
