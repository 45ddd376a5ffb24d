"""Build pinstage's compiled core, pinstage._C.

A CUDAExtension when torch was built with CUDA and a CUDA toolkit is found, else a CPU-only
CppExtension of the same sources (the .cu files are left out and PINSTAGE_WITH_CUDA is undefined).
Knobs (environment):
  PINSTAGE_FORCE_CPU=1     build the CPU-only extension even where CUDA is available
  PINSTAGE_FORCE_CUDA=1    build the CUDA extension or fail (no silent CPU fallback)
  TORCH_CUDA_ARCH_LIST     GPU architectures; default when no GPU is visible: "8.0;9.0+PTX"
  MAX_JOBS                 parallel compile jobs (torch's ninja builder honours it)
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _want_cuda():
    import torch

    if _flag("PINSTAGE_FORCE_CPU"):
        return False
    have = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if _flag("PINSTAGE_FORCE_CUDA"):
        if not have:
            raise RuntimeError(
                "PINSTAGE_FORCE_CUDA=1 but torch has no CUDA (torch.version.cuda=%r) or no CUDA "
                "toolkit was found (CUDA_HOME=%r)" % (torch.version.cuda, cpp_extension.CUDA_HOME)
            )
        return True
    return have


def _extension():
    with_cuda = _want_cuda()
    cpp = sorted(glob.glob(os.path.join("csrc", "*", "*.cpp")))
    # The C++ standard is the one torch requires (it adds the flag); -g0 drops the debug info that
    # Python's own CFLAGS ask for, which doubles compile time on torch's headers.
    cxx_flags = ["-O3", "-g0"]
    if not with_cuda:
        return cpp_extension.CppExtension("pinstage._C", cpp, include_dirs=[CSRC], extra_compile_args={"cxx": cxx_flags})
    import torch

    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        # torch would guess from a GPU it cannot see; Ampere and Hopper cover the engines' fleets,
        # and the PTX lets newer GPUs JIT the (tiny) kernels.
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
    cu = sorted(glob.glob(os.path.join("csrc", "*", "*.cu")))
    return cpp_extension.CUDAExtension(
        "pinstage._C",
        cpp + cu,
        include_dirs=[CSRC],
        define_macros=[("PINSTAGE_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
    )


setup(
    name="pinstage",
    version="0.1.0",
    description="Stage per-step host data onto the GPU through a pinned ring, without waiting",
    packages=find_packages(include=["pinstage", "pinstage.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch"],
)
