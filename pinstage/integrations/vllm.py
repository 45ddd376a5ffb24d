"""vLLM's host-to-device staging helpers on pinstage's ring: a vLLM general plugin.

`enable` is the plugin (entry point `pinstage` in the group `vllm.general_plugins`): vLLM calls it
in each process it starts when VLLM_PLUGINS names `pinstage` or is unset. While enabled:

- vllm.utils.torch_utils.async_tensor_h2d (and every module's own reference to it) stages through
  pinstage.stage_to_device, or pinstage.stage_into for `out=`, in place of a pinned tensor per call;
- UvaBufferPool.copy_to_uva / copy_to_gpu give a device tensor staged from the ring, in place of a
  view of a round-robin pinned buffer that the GPU reads whenever its kernel runs (wrong once more
  steps are in flight than the pool's depth); UvaBackedTensor goes through its pool;
- CpuGpuBuffer.copy_to_gpu stages its host rows through the ring, so that the host may rewrite
  .cpu/.np as soon as the call returns.

Same signatures, dtypes, shapes and devices as vLLM's. A call pinstage does not cover (a dtype it
lacks, a list without a dtype, a shape vLLM would broadcast) and a call on a stream capturing a CUDA
graph run vLLM's own function. Importing this module imports nothing of vLLM; enable() does.
"""
import functools
import importlib.metadata
import sys
import threading
import types
import warnings
from collections.abc import Sequence
from typing import Any, List, Tuple

import numpy as np
import torch

import pinstage

TESTED_VERSIONS = ("0.33.0",)

_DTYPES = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                     torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64))
_NUMPY_DTYPES = {torch.empty(0, dtype=t).numpy().dtype: t for t in _DTYPES if t is not torch.bfloat16}

_lock = threading.Lock()
_replaced: List[Tuple[Any, str, Any, Any]] = []  # (owner, name, original, replacement): what disable() puts back


def _host_data(data):
    return isinstance(data, (list, tuple, np.ndarray)) or (isinstance(data, torch.Tensor) and data.is_cpu)


def _staged_h2d(data, device=None, dtype=None, out=None):
    if out is not None:
        # vLLM broadcasts data into out; pinstage fills it element for element, so shapes must agree.
        same_shape = (out.dim() == 1 and len(data) == len(out) if isinstance(data, (list, tuple))
                      else _host_data(data) and tuple(data.shape) == tuple(out.shape))
        if dtype in (None, out.dtype) and out.dtype in _DTYPES and same_shape and out.is_contiguous():
            return pinstage.stage_into(data, out)
        return None
    if dtype is None and not isinstance(data, (list, tuple)):
        dtype = _NUMPY_DTYPES.get(data.dtype) if isinstance(data, np.ndarray) else getattr(data, "dtype", None)
    if device is None or dtype not in _DTYPES or not _host_data(data):
        return None
    return pinstage.stage_to_device(data, dtype, device=device)


def _pool_rows(pool, x):
    """x as the rows a UvaBufferPool gives: (len(x), *size[1:]) of the pool's dtype on the current
    device, in device memory of their own."""
    if pool.dtype not in _DTYPES or not _host_data(x):
        return None
    rows = pinstage.stage_to_device(x, pool.dtype)
    row_shape = tuple(pool.size[1:]) if isinstance(pool.size, Sequence) else ()
    return rows if tuple(rows.shape) == (len(x),) + row_shape else None


def _staged_pool_copy_to_gpu(self, x, out=None):
    rows = _pool_rows(self, x)
    if rows is None or out is None:
        return rows
    return out.copy_(rows, non_blocking=True)


def _staged_buffer_copy_to_gpu(self, n=None):
    cpu, gpu = (self.cpu, self.gpu) if n is None else (self.cpu[:n], self.gpu[:n])
    return pinstage.stage_into(cpu, gpu) if cpu.dtype in _DTYPES and gpu.is_contiguous() else None


def _routed(original, staged):
    """original's stand-in: `staged` where it covers the call (gives a result), else original."""

    @functools.wraps(original)
    def call(*args, **kwargs):
        try:
            result = staged(*args, **kwargs)
        except RuntimeError:
            # pinstage refuses a capturing stream (its ring would be reused before the graph
            # replays); there vLLM's own code runs, as it would without the plugin.
            if not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()):
                raise
            result = None
        return original(*args, **kwargs) if result is None else result

    return call


def _modules():
    return [module for module in list(sys.modules.values()) if isinstance(module, types.ModuleType)]


def _check_version():
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("pinstage.integrations.vllm: vLLM is not installed") from None
    if version.split("+")[0] not in TESTED_VERSIONS:  # a local build tag (+cu130) leaves the source as released
        raise RuntimeError("pinstage.integrations.vllm: vLLM %s is not supported; tested with vLLM %s"
                           % (version, ", ".join(TESTED_VERSIONS)))


def _replace(owner, name, staged):
    """Replaces owner.name; where owner is a module, also the reference that every module which did
    `from owner import name` holds (modules imported later take the replacement from owner)."""
    original = owner.__dict__[name]
    replacement = _routed(original, staged)
    holders = [owner]
    if isinstance(owner, types.ModuleType):
        holders += [module for module in _modules() if module is not owner and vars(module).get(name) is original]
    for holder in holders:
        _replaced.append((holder, name, original, replacement))
        setattr(holder, name, replacement)


def enable():
    """Routes vLLM's staging helpers through pinstage (the vLLM general plugin). Idempotent; does not
    initialise CUDA. Raises RuntimeError for a vLLM version it was not tested with."""
    with _lock:
        if _replaced:
            return
        _check_version()
        from vllm.utils import torch_utils
        from vllm.v1 import utils as v1_utils
        from vllm.v1.worker.gpu import buffer_utils

        _replace(torch_utils, "async_tensor_h2d", _staged_h2d)
        _replace(buffer_utils.UvaBufferPool, "copy_to_uva", _pool_rows)
        _replace(buffer_utils.UvaBufferPool, "copy_to_gpu", _staged_pool_copy_to_gpu)
        _replace(v1_utils.CpuGpuBuffer, "copy_to_gpu", _staged_buffer_copy_to_gpu)


def plugin():
    """The vLLM general plugin (entry point `pinstage` in vllm.general_plugins): enable(), except that
    under a vLLM version it was not tested with it warns and changes nothing. vLLM loads every
    installed plugin when VLLM_PLUGINS is unset, so raising here would stop vLLM from starting merely
    because pinstage is installed beside it."""
    try:
        _check_version()
    except RuntimeError as exc:
        warnings.warn("%s; vLLM's own staging helpers stay in place" % exc, RuntimeWarning, stacklevel=2)
        return
    enable()


def disable():
    """Puts back every original that enable() replaced, also in modules imported since then."""
    with _lock:
        originals = {replacement: original for _, _, original, replacement in _replaced}
        names = {name for _, name, _, _ in _replaced}
        for module in _modules():
            for name in names:
                held = vars(module).get(name)
                if isinstance(held, types.FunctionType) and held in originals:
                    setattr(module, name, originals[held])
        for owner, name, original, replacement in _replaced:
            if owner.__dict__.get(name) is replacement:  # leaves alone what others replaced since
                setattr(owner, name, original)
        _replaced.clear()

