# Sourced by scripts/test.sh and scripts/bench.sh: picks (or makes) the Python environment and
# builds pinstage._C in place when it is missing or older than its sources. Sets PY.
#
# - a .venv here that has torch: use it;
# - else a python3 that already has torch (a GPU machine with its own torch; nothing is downloaded);
# - else make .venv and install torch 2.14.1 and the build/test tools into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
  PY="$ROOT/.venv/bin/python"
elif python3 -c "import torch" 2>/dev/null; then
  PY="$(command -v python3)"
else
  echo "[pinstage] no torch found: creating .venv with torch 2.14.1" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >&2 || true
  .venv/bin/python -m pip install -q "torch==2.14.1" numpy pybind11 ninja pytest hypothesis setuptools wheel >&2
  PY="$ROOT/.venv/bin/python"
fi

# Tools the build and tests need; installed only where missing (a GPU machine already has them).
missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("numpy", "ninja", "pytest", "setuptools", "hypothesis") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "[pinstage] installing missing: $missing" >&2
  "$PY" -m pip install -q $missing >&2
fi

if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
lib="pinstage/_C$suffix"
build() {
  echo "[pinstage] building pinstage._C with $PY (CUDA_HOME=${CUDA_HOME:-none}, CXX=${CXX:-c++}, MAX_JOBS=$MAX_JOBS)" >&2
  "$PY" setup.py -q build_ext --inplace >&2
}
# A CXX from another toolchain than the C++ runtime the interpreter loads can build a module whose
# integer formatting (any error message with a number in it) crashes inside libstdc++; seen with an
# image whose CXX is a wrapper at /opt/gcc/bin/g++. So the fresh build raises one such error in a
# subprocess, and if that crashes, it is rebuilt with the system compiler.
error_path_works() {
  PYTHONPATH="$ROOT" "$PY" -c "
import pinstage
try:
    pinstage.configure(ring_bytes=-1)
except ValueError as e:
    assert '-1' in str(e)
" >/dev/null 2>&1
}
if [ ! -f "$lib" ] || [ -n "$(find csrc setup.py -newer "$lib" -print -quit)" ]; then
  build
  if ! error_path_works && [ -x /usr/bin/g++ ] && [ "${CXX:-}" != /usr/bin/g++ ]; then
    echo "[pinstage] the build crashes formatting errors (CXX=${CXX:-c++}); rebuilding with /usr/bin/g++" >&2
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc
    rm -rf build "$lib"
    build
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
