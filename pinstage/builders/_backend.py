"""The three ways a builder can move its host values to the device, behind one call.

"pinstage" is the project's path (one stage_many: one ring region, one copy). "pinned" and
"blocking" are the patterns engines use today; they exist so that the builders can be tested equal
and timed side by side on the same values.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch

import pinstage
from pinstage import _C
from pinstage._api import Device

# [(values, dtype), ...]: what stage() moves; values are lists, numpy arrays or CPU tensors.
Items = Sequence[Tuple[Any, torch.dtype]]

BACKENDS = ("pinstage", "pinned", "blocking")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def stage(items: Items, backend: str = "pinstage", stream: Optional[torch.cuda.Stream] = None,
          device: Device = None) -> List[torch.Tensor]:
    """[(values, dtype), ...] -> [tensor, ...] on the device pinstage would stage to, each equal to
    torch.tensor(values, dtype=dtype); copies are enqueued on `stream` (default: current stream).
    values: lists, numpy arrays or CPU tensors."""
    if backend == "pinstage":
        return pinstage.stage_many(items, stream, device=device)
    check_backend(backend)
    target = _C.target_device(stream, device)
    if target.type == "cpu":
        return [torch.as_tensor(values, dtype=dtype).clone() for values, dtype in items]
    with torch.cuda.stream(stream):
        if backend == "pinned":
            return [torch.as_tensor(values, dtype=dtype).pin_memory().to(target, non_blocking=True)
                    for values, dtype in items]
        return [torch.as_tensor(values, dtype=dtype).to(target) for values, dtype in items]
