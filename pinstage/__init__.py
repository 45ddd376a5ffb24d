"""pinstage: per-step host data onto the GPU through a pinned staging ring, without waiting.

    import pinstage
    ids = pinstage.stage_to_device(last_token_ids, torch.int64)           # current stream
    temps, top_ps = pinstage.stage_many([(t, torch.float32), (p, torch.float32)], stream)
    pinstage.stage_into(positions, graph_static_input)                    # before graph.replay()

Results equal torch.tensor(data, dtype=dtype) on the target device. The values are converted
straight into pinned ring memory and moved with one asynchronous copy on the caller's stream; a ring
byte is written again only after a CUDA event recorded behind the copy that read it has completed.
"""
import torch  # loads libtorch before the extension that links against it

from . import _C, _fallback, testing

_C._set_fallback(_fallback.host_tensor)
_fallback.register_buffer_types()

stage_to_device = _C.stage_to_device
stage_many = _C.stage_many
stage_into = _C.stage_into
stats = _C.stats
configure = _C.configure

__all__ = ["stage_to_device", "stage_many", "stage_into", "stats", "configure", "testing"]
__version__ = "0.1.0"
