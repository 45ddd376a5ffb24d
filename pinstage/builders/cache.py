"""write_cache_indices: point each request's row of req_to_token at its KV slots, as SGLang's
write_cache_indices does before a prefill: the cached prefix's slots at [0, prefix_len), the newly
allocated slots (its slice of out_cache_loc) at [prefix_len, seq_len)."""
import contextlib
from typing import Any, List, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

import pinstage

_FIELDS = ("req_pool_indices", "prefix_lens", "seq_lens", "extend_lens")

# One int per request: a list or an integer numpy array.
IntColumn = Union[Sequence[int], npt.NDArray[np.integer[Any]]]


def write_cache_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: IntColumn,
    prefix_tensors: Sequence[torch.Tensor],
    prefix_lens: IntColumn,
    seq_lens: IntColumn,
    extend_lens: IntColumn,
    out_cache_loc: torch.Tensor,
    *,
    stream: Optional[torch.cuda.Stream] = None,
) -> None:
    """req_to_token: int32 [rows, max_context_len]; out_cache_loc: int64 [sum(extend_lens)]; both on
    one device. req_pool_indices, prefix_lens, seq_lens, extend_lens: one int per request (lists or
    integer numpy arrays). prefix_tensors: one int64 1-D tensor per request on that device, at least
    prefix_len long.

    Everything is validated on the host before anything is staged or written (IndexError for a row
    outside req_to_token, TypeError for a wrong dtype, ValueError otherwise; messages name the
    request and the field). On CUDA it is one kernel launch on `stream` (default: the current
    stream) and the host does not wait. The prefix tensors are read by the kernel: as with any op on
    that stream, freeing them after the call is safe where the caching allocator orders their reuse
    (the same stream), not where another stream reuses their memory first.
    """
    for name, t in (("req_to_token", req_to_token), ("out_cache_loc", out_cache_loc)):
        # By type, not isinstance: an object whose __class__ claims torch.Tensor would be read as one.
        if not issubclass(type(t), torch.Tensor):
            raise TypeError(f"write_cache_indices: {name} must be a tensor, got {type(t).__name__}")
    # A copy taken before the ints are read: reading one can run Python code (an __index__) that
    # changes the list.
    prefix_tensors = list(prefix_tensors)
    rows, prefixes, lengths, extends = (
        _int64_column(name, column)
        for name, column in zip(_FIELDS, (req_pool_indices, prefix_lens, seq_lens, extend_lens))
    )
    # One op: it checks the CPU values on the host (extend_lens against the lengths too), computes
    # each request's offset in out_cache_loc and copies them with the prefix table in one copy.
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        try:
            torch.ops.pinstage.write_cache_indices(req_to_token, rows, prefix_tensors, prefixes, lengths, None,
                                                   out_cache_loc, extends)
        except (TypeError, RuntimeError):
            _raise_if_not_tensors(prefix_tensors)
            raise


def _raise_if_not_tensors(prefix_tensors: List[torch.Tensor]) -> None:
    """torch's error for a prefix_tensors entry that is no tensor (a RuntimeError from its argument
    parser), as a TypeError naming the request (looked for only once the op has refused the call)."""
    for i, t in enumerate(prefix_tensors):
        if not issubclass(type(t), torch.Tensor):
            raise TypeError(f"write_cache_indices: request {i}: prefix_tensors entry must be a tensor, got "
                            f"{type(t).__name__}") from None


def _int64_column(name: str, column: IntColumn) -> torch.Tensor:
    """One int per request as a CPU int64 tensor: integer numpy arrays as they are, other columns
    converted by pinstage's CPU path. A float, str or bool is refused (TypeError naming the request
    and the field), not truncated; lengths and ranges are checked by the op."""
    values = np.asarray(column)
    if values.ndim != 1:
        raise ValueError(f"write_cache_indices: {name} must be one int per request")
    if values.dtype.kind in "iu":
        if values.dtype.kind == "u" and values.size and values.max() >= 2**63:
            raise OverflowError(f"write_cache_indices: {name} has a value beyond int64")
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    for i, value in enumerate(column):
        if isinstance(value, (bool, np.bool_)) or not hasattr(type(value), "__index__"):
            raise TypeError(f"write_cache_indices: request {i}: {name} must be an int, got {type(value).__name__}")
    result: torch.Tensor = pinstage.stage_to_device(column, torch.int64, device="cpu")
    return result
