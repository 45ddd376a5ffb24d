# Sourced by scripts/test.sh and scripts/bench.sh: picks (or makes) the Python environment and builds
# pinstage._C in place when it is missing or older than its sources. Sets PY.
#   - a .venv here that has torch: use it;
#   - else a python3 that already has torch (a GPU machine's own; nothing is downloaded);
#   - else make .venv and install torch and the test and benchmark tools into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "[pinstage] $*" >&2; }

if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
  PY="$ROOT/.venv/bin/python"
elif python3 -c "import torch" 2>/dev/null; then
  PY="$(command -v python3)"
else
  say "no torch found: creating .venv and installing torch 2.14.1 (a CUDA build: about 5.5 GB on disk;"
  say "1.5-3.5 minutes from a warm pip cache, longer when it must download) with numpy, ninja, pytest, pytest-xdist, hypothesis, matplotlib, mypy"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >&2 || true
  .venv/bin/python -m pip install -q "torch==2.14.1" numpy ninja pytest pytest-xdist hypothesis matplotlib mypy setuptools wheel >&2
  PY="$ROOT/.venv/bin/python"
fi

missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("numpy", "ninja", "pytest", "hypothesis", "matplotlib", "setuptools")
               if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  say "installing what this Python lacks: $missing"
  "$PY" -m pip install -q $missing >&2
fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
lib="pinstage/_C$suffix"
build() {
  say "building pinstage._C ($MAX_JOBS parallel jobs; a first build takes 1-3 minutes)"
  # The whole log goes to build.log; the terminal gets setup.py's own lines and ninja's progress, one
  # line per compiled file, while it builds (not the compiler's command lines).
  if ! PYTHONUNBUFFERED=1 "$PY" setup.py build_ext --inplace 2>&1 | tee build.log | sed -unE \
      -e 's|^(pinstage setup: .*)|\1|p' \
      -e 's|^\[([0-9]+/[0-9]+)\] .* -c (/[^ ]*/)?(csrc/[^ ]+) .*|  [\1] \3|p' >&2; then
    tail -n 40 build.log >&2
    say "the build failed; the whole log is in build.log"
    return 1
  fi
}
# A compiler or linker from another toolchain than the C++ runtime the interpreter loads can build a
# module whose integer formatting (any error message with a number in it) crashes; so the fresh build
# raises one such error in a subprocess, and if that crashes, it is rebuilt with the system compiler.
error_path_works() {
  PYTHONPATH="$ROOT" "$PY" -c "
import torch, pinstage
try:
    pinstage.stage_to_device(range(2**61), torch.int64, device='cpu')
except RuntimeError as e:
    assert '2305843009213693952' in str(e)
" >/dev/null 2>&1
}
if [ ! -f "$lib" ] || [ -n "$(find csrc setup.py -newer "$lib" -print -quit)" ]; then
  build
  if ! error_path_works && [ -x /usr/bin/g++ ] && [ "${CXX:-}" != /usr/bin/g++ ]; then
    say "the build crashes formatting errors (CXX=${CXX:-c++}); rebuilding with /usr/bin/g++"
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc
    rm -rf build "$lib"
    build
  fi
fi
# The checkout on .venv's import path (a .pth file: an editable install that needs no second build),
# so that `.venv/bin/python` imports this pinstage from any directory. A Python we did not make is
# left alone.
if [ "$PY" = "$ROOT/.venv/bin/python" ]; then
  site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ "$(cat "$site/pinstage-checkout.pth" 2>/dev/null)" = "$ROOT" ] || echo "$ROOT" > "$site/pinstage-checkout.pth"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
