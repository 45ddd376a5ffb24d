"""vLLM's host-to-device staging helpers on pinstage's ring: a vLLM general plugin.

`plugin` is the entry point (`pinstage` in the group `vllm.general_plugins`): vLLM calls it in each
process it starts when VLLM_PLUGINS names `pinstage` or is unset. It routes the helpers below through
pinstage, with one log line (logger "pinstage", INFO) naming them, unless PINSTAGE_VLLM=0 or pinstage
cannot stage to vLLM's device here (a ROCm torch, no CUDA device visible, pinstage built without
CUDA): then it warns once and vLLM's own helpers stay. While routed:

- vllm.utils.torch_utils.async_tensor_h2d (and every module's own reference to it) stages through
  pinstage.stage_to_device, or pinstage.stage_into for `out=`, in place of a pinned tensor per call;
- UvaBufferPool.copy_to_uva / copy_to_gpu give a device tensor staged from the ring, in place of a
  view of a round-robin pinned buffer that the GPU reads whenever its kernel runs (wrong once more
  steps are in flight than the pool's depth); UvaBackedTensor goes through its pool, and a numpy
  array equal to the one the pool staged last time gets the same device rows again, uncopied;
- CpuGpuBuffer.copy_to_gpu stages its host rows through the ring, so that the host may rewrite
  .cpu/.np as soon as the call returns.

Same signatures, dtypes, shapes and devices as vLLM's. vLLM's own function runs a call that pinstage
does not cover (a dtype it lacks, a list without a dtype, a device it cannot stage to, a list into an
unsigned pool, whose range numpy checks) and every call that pinstage refuses (values it cannot
convert, a stream capturing a CUDA graph, a full ring with on_full="error"): so a replaced function
gives what vLLM's gives and raises what vLLM's raises. counters() says how many calls took each way.
Importing this module imports nothing of vLLM; enable() does.
"""

import functools
import importlib.metadata
import itertools
import logging
import os
import threading
import types
import warnings
from collections.abc import Sequence
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import torch

import pinstage

from ._patches import Patches

TESTED_VERSIONS = ("0.33.0",)
SWITCH = "PINSTAGE_VLLM"  # "0" (or off/false/no): the plugin leaves vLLM as it is


_UNSIGNED = frozenset((torch.uint8, torch.uint16, torch.uint32, torch.uint64))
# The dtypes pinstage stages (test_vllm_plugin checks them against its core's check).
_DTYPES = _UNSIGNED | {torch.bool, torch.int8, torch.int16, torch.int32, torch.int64}
_DTYPES |= {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_NUMPY_DTYPES = {torch.empty(0, dtype=t).numpy().dtype: t for t in _DTYPES if t is not torch.bfloat16}

_log = logging.getLogger("pinstage")
_lock = threading.Lock()
_patches = Patches()
# replaced function -> (calls routed through pinstage, calls left to vLLM): next() on a count is one
# C call, exact under threads and cheaper than a lock
_counts: Dict[str, Tuple[Iterator[int], Iterator[int]]] = {}
# Set by enable(): whether pinstage stages to CUDA here, where vLLM's UVA pools put their rows (None
# where pinstage cannot stage to it), and each `device` argument seen, as a target pinstage serves.
_cuda_served = False
_pool_device: Optional[torch.device] = None
_device_served: Dict[Any, bool] = {}


def _host_data(data):
    return isinstance(data, (list, tuple, np.ndarray)) or (isinstance(data, torch.Tensor) and data.is_cpu)


def _serves(device):
    return device.type == "cpu" or (device.type == "cuda" and _cuda_served)


def _serves_tensor(tensor):
    return tensor.is_cpu or (tensor.is_cuda and _cuda_served)


def _serves_argument(device):
    served = _device_served.get(device)
    if served is None:
        served = _device_served[device] = _serves(torch.device(device))
    return served


def _staged_h2d(data, device=None, dtype=None, out=None):
    if out is not None:
        # vLLM asserts that the dtypes agree and that data is on the host
        if (
            dtype not in (None, out.dtype)
            or out.dtype not in _DTYPES
            or not _host_data(data)
            or not _serves_tensor(out)
        ):
            return None
        if not isinstance(data, (list, tuple)) and tuple(data.shape) == tuple(out.shape) and out.is_contiguous():
            return pinstage.stage_into(data, out)
        # vLLM's out.copy_(torch.tensor(data)): broadcasts, or raises where the shapes do not fit
        return out.copy_(pinstage.stage_to_device(data, out.dtype, device=out.device), non_blocking=True)
    if dtype is None and not isinstance(data, (list, tuple)):
        dtype = _NUMPY_DTYPES.get(data.dtype) if isinstance(data, np.ndarray) else getattr(data, "dtype", None)
    if device is None or dtype not in _DTYPES or not _host_data(data) or not _serves_argument(device):
        return None
    return pinstage.stage_to_device(data, dtype, device=device)


# A numpy array up to this size that a pool staged last time is compared with that call's bytes.
_REUSE_BYTES = 1 << 16
_LAST = "_pinstage_last_rows"  # the pool's attribute: ((device, dtype, shape, bytes), rows staged)
_capturing = torch.cuda.is_current_stream_capturing


def _current_raw_stream(device):
    """(device index, the current stream's cudaStream_t) of `device` (its index or the current one)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch._C._cuda_getCurrentRawStream(index)


def _pool_rows(pool, x, reuse=False):
    """x as the rows a UvaBufferPool gives: (len(x), *size[1:]) of the pool's dtype on its device, in
    device memory of their own.

    reuse (copy_to_uva, whose rows vLLM only reads): UvaBackedTensor hands its whole host array to
    its pool every step, mostly unchanged; where the bytes, dtype and shape equal those the pool
    staged last time, the rows staged then are given again. They are device memory that no host
    write reaches, so they still hold these values; the call costs a byte comparison, not a copy.
    copy_to_gpu's caller owns its result (vLLM gives a clone) and may write it: never reused."""
    key = None
    if reuse and type(x) is np.ndarray and x.nbytes <= _REUSE_BYTES:
        # first, as it is most calls: a key equal to the stored one passed every check below. The
        # stream is part of it: rows given to another stream's kernels could be freed under them.
        # The raw handle, not torch.cuda.current_stream(): that builds a Stream object, several
        # microseconds on a call whose whole point is to cost less than a copy.
        on_cuda = _pool_device is not None and _pool_device.type == "cuda"
        stream = _current_raw_stream(_pool_device) if on_cuda else None
        key = (_pool_device, stream, x.dtype, x.shape, x.tobytes())
        last = pool.__dict__.get(_LAST)
        # a capturing stream gets vLLM's own pool, as a staging would (a graph must not keep rows
        # that the next change lets go)
        if last is not None and last[0] == key and not (on_cuda and _capturing()):
            return last[1]
    if pool.dtype not in _DTYPES or not _host_data(x) or _pool_device is None:
        return None
    if pool.dtype in _UNSIGNED and isinstance(x, (list, tuple)):
        return None  # numpy refuses a negative value there (OverflowError); torch.tensor wraps it
    rows = pinstage.stage_to_device(x, pool.dtype, device=_pool_device)
    row_shape = tuple(pool.size[1:]) if isinstance(pool.size, Sequence) else ()
    if tuple(rows.shape) != (len(x),) + row_shape:
        return None
    if key is not None:
        pool.__dict__[_LAST] = (key, rows)
    return rows


def _staged_pool_copy_to_uva(self, x):
    return _pool_rows(self, x, reuse=True)


def _staged_pool_copy_to_gpu(self, x, out=None):
    rows = _pool_rows(self, x)
    if rows is None or out is None:
        return rows
    return out.copy_(rows, non_blocking=True)


def _staged_buffer_copy_to_gpu(self, n=None):
    cpu, gpu = (self.cpu, self.gpu) if n is None else (self.cpu[:n], self.gpu[:n])
    if cpu.dtype not in _DTYPES or not gpu.is_contiguous() or not _serves_tensor(gpu):
        return None
    return pinstage.stage_into(cpu, gpu)


def _routed(label, original, staged):
    """original's stand-in: `staged` where it covers the call (gives a result), else original; also
    where pinstage raises, so that the caller gets vLLM's own result or exception (numpy's
    OverflowError for an out-of-range value in a pool, not pinstage's RuntimeError)."""
    routed, left = _counts.setdefault(label, (itertools.count(), itertools.count()))

    @functools.wraps(original)
    def call(*args, **kwargs):
        try:
            result = staged(*args, **kwargs)
        except Exception:
            result = None
        if result is None:
            next(left)
            return original(*args, **kwargs)
        next(routed)
        return result

    return call


def counters():
    """{replaced function: {"routed": calls staged by pinstage, "to_vllm": calls run by vLLM's own
    function}} since the process started (also while disabled: what ran through a replacement)."""
    return {label: {"routed": _value(routed), "to_vllm": _value(left)} for label, (routed, left) in _counts.items()}


def _value(count):
    return int(repr(count)[len("count(") : -1])  # the next value a count gives: the calls so far


def _check_version():
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("pinstage.integrations.vllm: vLLM is not installed") from None
    if version.split("+")[0] not in TESTED_VERSIONS:  # a local build tag (+cu130) leaves the source as released
        raise RuntimeError(
            "pinstage.integrations.vllm: vLLM %s is not supported; tested with vLLM %s"
            % (version, ", ".join(TESTED_VERSIONS))
        )


def _no_cuda_staging():
    """Why pinstage cannot stage to a CUDA device in this process, or None. Makes no CUDA call:
    vLLM loads plugins in processes that fork workers, and a driver initialised before a fork (as
    torch.cuda.is_available()'s cudaGetDeviceCount does) is unusable in the child;
    torch.cuda.device_count() asks NVML first."""
    if torch.version.hip:
        return "torch %s is a ROCm build; pinstage stages to CUDA devices only" % torch.__version__
    if not pinstage._C.built_with_cuda:
        return "this pinstage was built without CUDA (rebuild it where the CUDA toolkit is: see the README)"
    if torch.cuda.device_count() == 0:
        return "no CUDA device is visible"
    return None


def _replace(owner, name, staged):
    """Replaces owner.name; where owner is a module, also the reference that every module which did
    `from owner import name` holds (modules imported later take the replacement from owner)."""
    label = name if isinstance(owner, types.ModuleType) else "%s.%s" % (owner.__name__, name)
    _patches.replace(owner, name, _routed(label, owner.__dict__[name], staged), importers=True)
    return label


def enable():
    """Routes vLLM's staging helpers through pinstage, also where pinstage cannot stage to CUDA
    (calls for such a device run vLLM's own function; plugin() declines instead). Idempotent; does
    not initialise CUDA. Raises RuntimeError for a vLLM version it was not tested with."""
    global _cuda_served, _pool_device
    with _lock:
        if _patches:
            return
        _check_version()
        from vllm.platforms import current_platform
        from vllm.utils import torch_utils
        from vllm.v1 import utils as v1_utils
        from vllm.v1.worker.gpu import buffer_utils

        _cuda_served = _no_cuda_staging() is None
        _device_served.clear()
        pool_device = torch.device(current_platform.device_type)  # UVA views and NonUvaBuffer are there
        _pool_device = pool_device if _serves(pool_device) else None
        try:
            labels = [
                _replace(torch_utils, "async_tensor_h2d", _staged_h2d),
                _replace(buffer_utils.UvaBufferPool, "copy_to_uva", _staged_pool_copy_to_uva),
                _replace(buffer_utils.UvaBufferPool, "copy_to_gpu", _staged_pool_copy_to_gpu),
                _replace(v1_utils.CpuGpuBuffer, "copy_to_gpu", _staged_buffer_copy_to_gpu),
            ]
        except BaseException:
            _patches.restore()  # all or nothing: a later enable() must not find half a patch
            raise
        _log.info(
            "pinstage %s: vLLM's %s stage through pinstage's ring (%s=0 turns this off; "
            "pinstage.integrations.vllm.counters() counts the calls)",
            pinstage.__version__,
            ", ".join(labels),
            SWITCH,
        )


def _switched_off():
    return os.environ.get(SWITCH, "").strip().lower() in ("0", "off", "false", "no")


def plugin():
    """The vLLM general plugin (entry point `pinstage` in vllm.general_plugins): enable(), unless
    PINSTAGE_VLLM=0, or the vLLM version was not tested, or pinstage cannot stage to CUDA here; in
    the last two cases it warns once and changes nothing. vLLM loads every installed plugin when
    VLLM_PLUGINS is unset, so raising here would stop vLLM from starting merely because pinstage is
    installed beside it."""
    if _switched_off():
        _log.info("pinstage: %s=0, vLLM's own staging helpers stay in place", SWITCH)
        return
    try:
        _check_version()
        why = _no_cuda_staging()
        if why is None:
            enable()
    except Exception as exc:  # whatever went wrong, vLLM must start as shipped
        why = str(exc) if isinstance(exc, RuntimeError) else "%s: %s" % (type(exc).__name__, exc)
    if why is not None:
        warnings.warn(
            "pinstage.integrations.vllm: %s; vLLM's own staging helpers stay in place" % why,
            RuntimeWarning,
            stacklevel=2,
        )


def disable():
    """Puts back every original that enable() replaced, also in modules imported since then, except
    where other code has replaced pinstage's function since (that wrapper stays)."""
    with _lock:
        _patches.restore()
