"""pinstage: per-step host data onto the GPU through a pinned ring, without waiting.

    import pinstage
    ids = pinstage.stage_to_device(last_token_ids, torch.int64)           # current stream
    temps, top_ps = pinstage.stage_many([(t, torch.float32), (p, torch.float32)], stream)
    pinstage.stage_into(positions, graph_static_input)                    # before graph.replay()
    inputs.stage({"input_ids": ids, "positions": pos}, n)                 # a StaticInputs: one copy
    with pinstage.fetch_to_host(next_tokens) as tokens:                   # device -> host, no wait
        ...

Results equal torch.tensor(data, dtype=dtype) on the target device. The values are converted
straight into pinned ring memory and moved with one asynchronous copy on the caller's stream; a ring
byte is written again only after a CUDA event recorded behind the copy that read it has completed.
"""
import torch  # loads libtorch before the extension that links against it

try:
    from . import _C
except ImportError as exc:
    import glob
    import os

    _built = glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so"))
    _why = "does not load (%s)" % exc if _built else "is not built"  # else Python calls it a circular import
    raise ImportError(
        "pinstage's compiled extension (pinstage._C) %s. Build it with `pip install --no-build-isolation .` "
        "(or `python setup.py build_ext --inplace` in a checkout)." % _why
    ) from None

from . import _fallback, testing
from ._version import __version__
from ._static_inputs import Field, StaticInputs
from ._api import (
    FetchHandle,
    RingFullError,
    configure,
    empty_cache,
    fetch_many,
    fetch_to_host,
    stage_into,
    stage_many,
    stage_to_device,
    stats,
)

_C._set_fallback(_fallback.host_tensor)
_fallback.register_buffer_types()

__all__ = [
    "FetchHandle",
    "Field",
    "RingFullError",
    "StaticInputs",
    "configure",
    "empty_cache",
    "fetch_many",
    "fetch_to_host",
    "stage_into",
    "stage_many",
    "stage_to_device",
    "stats",
    "testing",
]
