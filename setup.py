"""Builds pinstage's compiled core, pinstage._C (the package metadata is in pyproject.toml).

With a visible GPU and a usable CUDA toolkit: a CUDA extension. Anywhere else: the CPU-only
extension of the same sources (the .cu files left out, PINSTAGE_WITH_CUDA undefined), which stages
to the CPU. It says in one line which one it builds and why. Knobs (environment):
  PINSTAGE_FORCE_CUDA=1    build the CUDA extension without a visible GPU (a wheel, a build box)
  PINSTAGE_FORCE_CPU=1     build the CPU-only extension even where CUDA is usable
  PINSTAGE_SANITIZE=1      AddressSanitizer + UBSan build of the CPU-only extension, for the tests
  CUDA_HOME                the toolkit (else torch's guess, then /usr/local/cuda)
  TORCH_CUDA_ARCH_LIST     GPU architectures; default without a visible GPU: "8.0;9.0+PTX"
  MAX_JOBS                 parallel compile jobs
"""

import glob
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from torch.utils import cpp_extension
except ModuleNotFoundError as exc:
    if (exc.name or "").split(".")[0] != "torch":
        raise
    # pip's --no-build-isolation uses the Python it runs in; the extension links against its torch.
    sys.exit(
        "pinstage setup: torch must be installed first: pinstage's extension is compiled against the torch of "
        "the Python that builds it (%s), which has none. Install torch (e.g. `%s -m pip install torch`), then "
        "`pip install --no-build-isolation .` again." % (sys.executable, sys.executable)
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _say(message):
    print("pinstage setup: " + message, file=sys.stderr, flush=True)


def _usable_cuda_home():
    """The toolkit to build with: CUDA_HOME, torch's guess, or /usr/local/cuda, whichever has the
    runtime headers and nvcc (torch guesses from `nvcc` on PATH, which may be a wrapper elsewhere)."""
    for home in (os.environ.get("CUDA_HOME"), cpp_extension.CUDA_HOME, "/usr/local/cuda"):
        if (
            home
            and os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h"))
            and os.path.isfile(os.path.join(home, "bin", "nvcc"))
        ):
            return home
    return None


def _want_cuda():
    import torch

    if _flag("PINSTAGE_FORCE_CPU") or _flag("PINSTAGE_SANITIZE"):
        _say("building the CPU-only extension (PINSTAGE_FORCE_CPU or PINSTAGE_SANITIZE is set)")
        return False
    home = _usable_cuda_home()
    forced = _flag("PINSTAGE_FORCE_CUDA")
    if torch.version.cuda is None or home is None:
        reason = (
            "torch %s has no CUDA" % torch.__version__
            if torch.version.cuda is None
            else "no CUDA toolkit with headers was found (looked at CUDA_HOME=%r, %r and /usr/local/cuda; set "
            "CUDA_HOME to the toolkit's folder)" % (os.environ.get("CUDA_HOME"), cpp_extension.CUDA_HOME)
        )
        if forced:
            raise RuntimeError("pinstage setup: PINSTAGE_FORCE_CUDA=1 but " + reason)
        _say("building the CPU-only extension: " + reason)
        return False
    if not forced and not torch.cuda.is_available():
        _say(
            "building the CPU-only extension: no GPU is visible (PINSTAGE_FORCE_CUDA=1 builds CUDA anyway, with "
            "the toolkit at %s)" % home
        )
        return False
    os.environ["CUDA_HOME"] = home
    cpp_extension.CUDA_HOME = home
    _say("building the CUDA extension with the toolkit at %s" % home)
    return True


def _extension():
    with_cuda = _want_cuda()
    cpp = sorted(glob.glob(os.path.join("csrc", "*", "*.cpp")))
    # -g0: Python's own CFLAGS ask for debug info, which doubles compile time on torch's headers.
    cxx_flags = ["-O3", "-g0", "-fvisibility=hidden"]
    link_flags = []
    if _flag("PINSTAGE_SANITIZE"):
        cxx_flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"]
        link_flags = ["-fsanitize=address,undefined"]
    if not with_cuda:
        return cpp_extension.CppExtension(
            "pinstage._C", cpp, include_dirs=[CSRC], extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags
        )
    import torch

    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        # torch would guess from a GPU it cannot see; Ampere and Hopper cover the engines' fleets, and
        # the PTX lets newer GPUs JIT the (tiny) kernel.
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
    cu = sorted(glob.glob(os.path.join("csrc", "*", "*.cu")))
    return cpp_extension.CUDAExtension(
        "pinstage._C",
        cpp + cu,
        include_dirs=[CSRC],
        define_macros=[("PINSTAGE_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
    )


class BuildPy(build_py):
    """Also puts pinstage-sglang.pth at the top of the build, so that it lands in site-packages beside
    pinstage (where Python runs .pth files at start): PINSTAGE_SGLANG=1 then reaches every process."""

    PTH = "pinstage-sglang.pth"

    def run(self):
        super().run()
        self.copy_file(os.path.join(ROOT, self.PTH), os.path.join(self.build_lib, self.PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, self.PTH)]


setup(ext_modules=[_extension()], cmdclass={"build_ext": cpp_extension.BuildExtension, "build_py": BuildPy})
