"""pinstage: per-step host data onto the GPU through a pinned ring, without waiting.

    import pinstage
    ids = pinstage.stage_to_device(last_token_ids, torch.int64)           # current stream
    temps, top_ps = pinstage.stage_many([(t, torch.float32), (p, torch.float32)], stream)
    pinstage.stage_into(positions, graph_static_input)                    # before graph.replay()
    inputs.stage({"input_ids": ids, "positions": pos}, n)                 # a StaticInputs: one copy
    with pinstage.fetch_to_host(next_tokens) as handle:                   # device -> host, no wait
        tokens = handle.tolist()                                          # waits for this copy only

Results equal torch.tensor(data, dtype=dtype) on the target device. The values are converted
straight into pinned ring memory and moved with one asynchronous copy on the caller's stream; a ring
byte is written again only after a CUDA event recorded behind the copy that read it has completed.
"""

import torch  # noqa: F401 - loads libtorch before the extension that links against it


def _unloadable(exc):
    """The ImportError for an extension that does not load: what is wrong and what to do, including
    the case of a source folder that shadows a built pinstage further down sys.path."""
    import glob
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if glob.glob(os.path.join(here, "_C*.so")):
        return ImportError(
            "pinstage's compiled extension (pinstage._C) does not load (%s). Rebuild it with `pip "
            "install --no-build-isolation .` (or `python setup.py build_ext --inplace` in a "
            "checkout)." % exc
        )
    # Not built ("is not built", else Python calls it a circular import). A built copy later on
    # sys.path means this folder shadows it: the usual case is running inside a checkout after
    # `pip install .`, where the current directory comes first.
    others = [
        os.path.join(entry, "pinstage")
        for entry in sys.path
        if os.path.abspath(os.path.join(entry or os.curdir, "pinstage")) != here
        and glob.glob(os.path.join(entry or os.curdir, "pinstage", "_C*.so"))
    ]
    if others:
        return ImportError(
            "pinstage's compiled extension (pinstage._C) is not built in %s, the source folder Python imported: it "
            "comes first on sys.path (the current directory or PYTHONPATH) and shadows the built pinstage at %s. "
            "Run from another directory to import that one, or build this folder in place with `python setup.py "
            "build_ext --inplace` (`pip install --no-build-isolation .` installs into site-packages, which this "
            "folder shadows)." % (here, os.path.abspath(others[0]))
        )
    return ImportError(
        "pinstage's compiled extension (pinstage._C) is not built. Build it with `pip install "
        "--no-build-isolation .` (or `python setup.py build_ext --inplace` in a checkout)."
    )


try:
    from . import _C
except ImportError as _exc:
    raise _unloadable(_exc) from None

# After the extension loaded (or its failure was explained).
from . import _fallback, testing  # noqa: E402
from ._api import (  # noqa: E402
    FetchHandle,
    RingFullError,
    Stats,
    configure,
    empty_cache,
    fetch_many,
    fetch_to_host,
    stage_into,
    stage_many,
    stage_to_device,
    stats,
)
from ._static_inputs import Field, StaticInputs  # noqa: E402
from ._version import __version__  # noqa: E402

_C._set_fallback(_fallback.torch_tensor)
_C._set_remade(_fallback.remade)
_fallback.register_buffer_types()

__all__ = [
    "__version__",
    "FetchHandle",
    "Field",
    "RingFullError",
    "StaticInputs",
    "Stats",
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
