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
  .venv/bin/python -m pip install -q "torch==2.14.1" numpy pybind11 ninja pytest setuptools wheel >&2
  PY="$ROOT/.venv/bin/python"
fi

# Tools the build and tests need; installed only where missing (a GPU machine already has them).
missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("numpy", "ninja", "pytest", "setuptools") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "[pinstage] installing missing: $missing" >&2
  "$PY" -m pip install -q $missing >&2
fi

if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

# The extension must be compiled against the C++ runtime the interpreter loads. A CXX from another
# GCC than the system's builds a module whose integer formatting (every error message with a
# number in it) crashes inside libstdc++: seen with an image that sets CXX=/opt/gcc/bin/g++.
# So where CXX names a different GCC version than /usr/bin/g++, the system compiler is used.
# PINSTAGE_KEEP_CXX=1 keeps CXX as it is.
if [ -n "${CXX:-}" ] && [ -x /usr/bin/g++ ] && [ "${PINSTAGE_KEEP_CXX:-0}" != 1 ]; then
  if [ "$("$CXX" -dumpfullversion 2>/dev/null)" != "$(/usr/bin/g++ -dumpfullversion 2>/dev/null)" ]; then
    echo "[pinstage] CXX=$CXX is not the system GCC; building with /usr/bin/g++ (PINSTAGE_KEEP_CXX=1 to keep it)" >&2
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc
  fi
fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
lib="pinstage/_C$suffix"
if [ ! -f "$lib" ] || [ -n "$(find csrc setup.py -newer "$lib" -print -quit)" ]; then
  echo "[pinstage] building pinstage._C with $PY (CUDA_HOME=${CUDA_HOME:-none}, MAX_JOBS=$MAX_JOBS)" >&2
  "$PY" setup.py -q build_ext --inplace >&2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
