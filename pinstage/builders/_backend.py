"""The three ways a builder can move its host values to the device, behind one call.

"pinstage" is the project's path (one stage_many: one ring region, one copy). "pinned" and
"blocking" are the patterns engines use today; they exist so that the builders can be tested equal
and timed side by side on the same values.
"""
import numpy as np
import torch

import pinstage

BACKENDS = ("pinstage", "pinned", "blocking")


def check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def resolve_device(stream=None, device=None):
    """The device pinstage would stage onto: the stream's, else `device`, else the current CUDA
    device when there is one, else the CPU."""
    if stream is not None:
        return stream.device
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def stage(items, backend="pinstage", stream=None, device=None):
    """[(values, dtype), ...] -> [tensor, ...] on the resolved device, each equal to
    torch.tensor(values, dtype=dtype); copies are enqueued on `stream` (default: current stream)."""
    if backend == "pinstage":
        return pinstage.stage_many(items, stream, device=device)
    check_backend(backend)
    target = resolve_device(stream, device)
    if target.type == "cpu":
        return [torch.tensor(values, dtype=dtype) for values, dtype in items]
    with torch.cuda.stream(stream):
        if backend == "pinned":
            return [_pinned(values, dtype).to(target, non_blocking=True) for values, dtype in items]
        return [torch.tensor(values, dtype=dtype, device=target) for values, dtype in items]


def _pinned(values, dtype):
    # torch.tensor(ndarray, pin_memory=True) raises "Can't pin tensor constructed from numpy";
    # engines pin the converted tensor instead.
    if isinstance(values, np.ndarray):
        return torch.tensor(values, dtype=dtype).pin_memory()
    return torch.tensor(values, dtype=dtype, pin_memory=True)
