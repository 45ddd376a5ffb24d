"""vLLM 0.33's staging modules, imported from its released source with its heavy imports stood in.

Only the modules under test run as released (torch_utils, platform_utils, torch_version, envs,
v1/utils.py, v1/worker/gpu/buffer_utils.py, and for bench/vllm_loop.py the default model runner's
per-request state: v1/worker/gpu/states.py, block_table.py and the sampler's states in sample/);
what they import for other purposes (zmq, uvloop, usage stats, the scheduler's output, vLLM's logger
and platform detection, its compiled ops, SamplingParams, the sampling kernels that the states only
name) is a stand-in here, so that the unpacked subset stays small and imports without vLLM's
dependencies.
"""

import importlib
import logging
import re
import sys
import types

import torch

from .source import engine_root

VLLM_VERSION = "0.33.0"
# The wheel's files that run as released; everything else vLLM would import is a stand-in below.
VLLM_FILES = [
    "vllm/envs.py",
    "vllm/utils/__init__.py",
    "vllm/utils/platform_utils.py",
    "vllm/utils/torch_utils.py",
    "vllm/utils/torch_version.py",
    "vllm/v1/__init__.py",
    "vllm/v1/utils.py",
    "vllm/v1/worker/__init__.py",
    "vllm/v1/worker/gpu/__init__.py",
    "vllm/v1/worker/gpu/buffer_utils.py",
    # the default model runner's input-preparation objects (bench/vllm_loop.py)
    "vllm/utils/math_utils.py",
    "vllm/v1/worker/gpu/states.py",
    "vllm/v1/worker/gpu/block_table.py",
    "vllm/v1/worker/gpu/sample/__init__.py",
    "vllm/v1/worker/gpu/sample/states.py",
    "vllm/v1/worker/gpu/sample/penalties.py",
    "vllm/v1/worker/gpu/sample/logit_bias.py",
    "vllm/v1/worker/gpu/sample/bad_words.py",
    "vllm/v1/worker/gpu/sample/logits_processor/interface.py",
]


class _Platform:
    """vllm.platforms.current_platform: CUDA with pinned memory where a GPU is visible. Without one,
    an accelerator whose device is the CPU and which has no pinned memory, so that vLLM's originals
    take their explicit-copy path (NonUvaBuffer) and give CPU tensors to compare with."""

    def __init__(self):
        self.cuda = torch.cuda.device_count() > 0  # NVML: no driver call, so that a fork may still use CUDA
        self.device_type = "cuda" if self.cuda else "cpu"
        self.device_name = self.device_type
        self.dispatch_key = "CUDA" if self.cuda else "CPU"

    def is_pin_memory_available(self):
        return self.cuda

    def is_cuda(self):
        return self.cuda

    def is_cuda_alike(self):
        return self.cuda

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def current_stream(self):
        return torch.cuda.current_stream()


class _Logger(logging.LoggerAdapter):
    def __init__(self, name):
        super().__init__(logging.getLogger(name), {})

    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args, **kwargs)

    info_once = debug_once = warning_once


_stand_ins = []  # names of the stand-in modules outside vllm.* (uvloop, regex where missing)
_parked = {}  # what unload_vllm() took out of sys.modules: torch_utils registers types it cannot register twice


def _module(name, **attrs):
    """A stand-in module `name` with `attrs`, below the wheel's own packages where it has them."""
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    parent, _, child = name.rpartition(".")
    if parent:
        try:
            package = importlib.import_module(parent)
        except ModuleNotFoundError:
            package = _module(parent)
        setattr(package, child, module)
    sys.modules[name] = module
    return module


def _triton():
    """The real triton where it is installed (buffer_utils only decorates its kernels at import);
    else a stand-in whose jit leaves the function as it is."""
    try:
        import triton
        import triton.language as tl

        return triton, tl
    except ImportError:
        jit = types.SimpleNamespace(
            jit=lambda fn=None, **kw: fn if fn is not None else (lambda f: f), cdiv=lambda a, b: -(-a // b)
        )
        return jit, types.SimpleNamespace(constexpr=int)


def _uva_view(cpu_tensor):
    """vLLM's compiled get_cuda_view_from_cpu_tensor: the pinned host memory itself, addressed by
    the GPU (unified virtual addressing), so that a kernel reads the host's bytes when it runs."""
    assert cpu_tensor.is_pinned(), "a UVA view needs pinned memory"

    class Host:
        __cuda_array_interface__ = {
            "shape": tuple(cpu_tensor.shape),
            "strides": tuple(s * cpu_tensor.element_size() for s in cpu_tensor.stride()),
            "typestr": torch.empty(0, dtype=cpu_tensor.dtype).numpy().dtype.str,
            "data": (cpu_tensor.data_ptr(), False),
            "version": 3,
        }

    view = torch.as_tensor(Host(), device="cuda")
    view._host = cpu_tensor  # the view must keep the pinned memory alive
    return view


class SamplingParams:
    """vllm.sampling_params.SamplingParams: the fields the runner's sampling and logits-processor
    states read, with vLLM's defaults (no penalty, no bias, no bad words, no seed)."""

    def __init__(self, **fields):
        self.temperature, self.top_p, self.top_k, self.min_p = 1.0, 1.0, 0, 0.0
        self.seed = self.logprobs = self.logit_bias = self.allowed_token_ids = None
        self.repetition_penalty, self.frequency_penalty, self.presence_penalty = 1.0, 0.0, 0.0
        self.min_tokens, self.all_stop_token_ids = 0, set()
        self.structured_outputs = self.bad_words_token_ids = None
        for name, value in fields.items():
            if not hasattr(self, name):
                raise TypeError("SamplingParams stand-in has no field %r" % name)
            setattr(self, name, value)


def _install_stand_ins(root):
    if "vllm" in sys.modules:
        return
    vllm = _module("vllm")
    vllm.__path__ = [str(root / "vllm")]  # submodules from the wheel, without vllm/__init__'s imports
    _module("vllm.logger", init_logger=_Logger)
    _module("vllm.platforms", current_platform=_Platform())
    triton, tl = _triton()
    _module("vllm.triton_utils", triton=triton, tl=tl)
    _module(
        "vllm.usage.usage_lib",
        UsageContext=types.SimpleNamespace(ENGINE_CONTEXT="engine"),
        is_usage_stats_enabled=lambda: False,
        usage_message=None,
    )
    _module("vllm.utils.network_utils", ZmqListener=object, get_open_zmq_ipc_path=None, get_tcp_uri=None)
    _module("vllm.utils.system_utils", decorate_logs=None, kill_process_tree=None, set_process_title=None)
    _module("vllm.v1.core.sched.output", SchedulerOutput=object)
    # what the runner's state modules import but the loop never calls (sampling and attention code)
    _module("vllm.sampling_params", SamplingParams=SamplingParams)
    _module("vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1)
    _module("vllm.v1.sample.ops.topk_topp_sampler", apply_top_k_top_p=None)
    gpu = root / "vllm" / "v1" / "worker" / "gpu"
    _module("vllm.v1.worker.gpu.sample.gumbel", apply_temperature=None)
    _module("vllm.v1.worker.gpu.sample.min_p", apply_min_p=None)
    # the package without its __init__, which loads custom-processor plugins; interface.py is real
    _module("vllm.v1.worker.gpu.sample.logits_processor").__path__ = [str(gpu / "sample" / "logits_processor")]
    for name, stand_in in (("uvloop", {}), ("regex", re.__dict__)):
        try:
            importlib.import_module(name)
        except ImportError:
            _module(name, **stand_in)
            _stand_ins.append(name)
    if torch.cuda.device_count() > 0 and not hasattr(torch.ops._C, "get_cuda_view_from_cpu_tensor"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("get_cuda_view_from_cpu_tensor(Tensor cpu_tensor) -> Tensor")
        lib.impl("get_cuda_view_from_cpu_tensor", _uva_view, "CPU")
        _install_stand_ins.library = lib  # a Library unregisters its ops when collected


def unload_vllm():
    """Takes vLLM's modules and the stand-ins out of sys.modules again, so that later code that
    probes for vLLM (SGLang does) does not find this partial copy."""
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")] + _stand_ins:
        _parked[name] = sys.modules.pop(name)


def load_vllm():
    """vLLM 0.33's (torch_utils, v1_utils, buffer_utils) modules; source.Unavailable saying why not.
    The runner's state modules (states, block_table, sample.*) import from here on."""
    root = engine_root("vllm", VLLM_VERSION, VLLM_FILES)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # also where importlib.metadata finds vLLM's version
    sys.modules.update(_parked)
    _parked.clear()
    _install_stand_ins(root)
    return types.SimpleNamespace(
        torch_utils=importlib.import_module("vllm.utils.torch_utils"),
        v1_utils=importlib.import_module("vllm.v1.utils"),
        buffer_utils=importlib.import_module("vllm.v1.worker.gpu.buffer_utils"),
    )


if __name__ == "__main__":
    # python -m bench.engines.vllm_stubs: writes .engines/vllm-<version> (the files listed above, from
    # the cache or the wheel), the copy to carry to a machine without a package index.
    import shutil

    from .source import REPO

    dest = REPO / ".engines" / ("vllm-" + VLLM_VERSION)
    shutil.rmtree(dest, ignore_errors=True)  # else engine_root would offer it as the source
    shutil.copytree(engine_root("vllm", VLLM_VERSION, VLLM_FILES), dest)
    print("wrote %s (%d files)" % (dest, sum(1 for p in dest.rglob("*") if p.is_file())))
