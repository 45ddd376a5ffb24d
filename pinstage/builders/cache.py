"""write_cache_indices: point each request's row of req_to_token at its KV slots, as SGLang's
write_cache_indices does before a prefill: the cached prefix's slots at [0, prefix_len), the newly
allocated slots (its slice of out_cache_loc) at [prefix_len, seq_len)."""

from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

import pinstage
from pinstage import _C
from pinstage._fallback import remade

from ._checks import is_integer_dtype, is_plain_int_list, require_host_tensor

_FIELDS = ("req_pool_indices", "prefix_lens", "seq_lens", "extend_lens")

# One int per request: a list, an integer numpy array or an integer CPU tensor.
IntColumn = Union[Sequence[int], npt.NDArray[np.integer[Any]], torch.Tensor]


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
    one device. req_pool_indices, prefix_lens, seq_lens, extend_lens: one int per request (lists,
    integer numpy arrays or integer CPU tensors). prefix_tensors: one int64 1-D tensor per request on
    that device, at least prefix_len long.

    Everything is validated on the host before anything is staged or written (IndexError for a row
    outside req_to_token, TypeError for a wrong dtype, a float or a bool, ValueError otherwise;
    messages name the request and the field; RuntimeError for a req_to_token whose rows share memory
    or that overlaps an input). On CUDA it is one kernel launch on `stream` (default: the current
    stream) and the host does not wait. The prefix tensors are read by the kernel: as with any op on
    that stream, freeing them after the call is safe where the caching allocator orders their reuse
    (the same stream), not where another stream reuses their memory first.
    """
    for name, t in (("req_to_token", req_to_token), ("out_cache_loc", out_cache_loc)):
        # By type, not isinstance: an object whose __class__ claims torch.Tensor would be read as one.
        if not issubclass(type(t), torch.Tensor):
            raise TypeError(f"write_cache_indices: {name} must be a tensor, got {type(t).__name__}")
    if stream is not None:  # the op runs on the current stream
        with torch.cuda.stream(stream):
            return write_cache_indices(
                req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc
            )
    # The op's kernel, called without torch's dispatcher (a scheduler step pays for each layer of
    # code a call runs: docs/design.md): it checks the values on the host (extend_lens against the
    # lengths too), computes each request's offset in out_cache_loc and launches one kernel. Lists
    # of Python ints, an engine's usual columns, are converted by that call itself into the op's own
    # memory; it returns False, having done nothing, where an entry is another kind of int or beyond
    # int64, and the checked path below hands it CPU tensors.
    plain = type(req_pool_indices) is type(prefix_lens) is type(seq_lens) is type(extend_lens) is list
    if plain and _C.write_cache_indices(
        req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, out_cache_loc, extend_lens
    ):
        return
    # A copy taken before the ints are read: reading one can run Python code (an __index__) that
    # changes the list.
    prefix_tensors = list(prefix_tensors)
    columns = (req_pool_indices, prefix_lens, seq_lens, extend_lens)
    rows, prefixes, lengths, extends = [_int64_column(name, c) for name, c in zip(_FIELDS, columns)]
    _C.write_cache_indices(req_to_token, rows, prefix_tensors, prefixes, lengths, out_cache_loc, extends)


def _int64_column(name: str, column: IntColumn) -> torch.Tensor:
    """One int per request as a CPU int64 tensor: integer tensors and numpy arrays as they are,
    lists converted by pinstage's CPU path. A float, bool, complex or str column or entry is refused
    (TypeError naming the field and the request or the dtype), never truncated or read as 0/1 into
    another request's row; lengths and ranges are checked by the op."""
    if isinstance(column, torch.Tensor):
        require_host_tensor(f"write_cache_indices: {name}", column)
    if isinstance(column, (torch.Tensor, np.ndarray)):
        dtype = column.dtype
        if 0 not in column.shape and not is_integer_dtype(dtype):  # an empty batch's column may be float
            what = "a tensor" if isinstance(column, torch.Tensor) else "a numpy array"
            raise TypeError(f"write_cache_indices: {name} must hold integers, got {what} of {dtype}")
        if (
            isinstance(column, torch.Tensor)
            and dtype == torch.int64
            and column.device.type == "cpu"
            and column.dim() == 1
        ):
            # itself where it is (the op checks its memory against req_to_token's); a negative view's
            # values, not its bytes
            return column.resolve_neg().contiguous()
    else:
        # A copy: reading an entry can run Python code (an __index__) that changes the list.
        column = list(column)
        if not is_plain_int_list(column):
            # numpy reads [True, 2] and [tensor(0.9)] as ints: each entry is looked at.
            _check_entries(name, column)
    values = np.asarray(column)
    if values.ndim != 1:
        raise ValueError(f"write_cache_indices: {name} must be one int per request")
    if values.dtype.kind in "iu":
        if values.dtype.kind == "u" and values.size and values.max() >= 2**63:
            i = int(np.argmax(values >= 2**63))
            raise ValueError(f"write_cache_indices: {name}: request {i}: {values[i]} is beyond int64")
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if isinstance(column, np.ndarray):  # an object array: its checked entries, which torch reads as a list
        _check_entries(name, column)
        column = column.tolist()
    try:
        result: torch.Tensor = pinstage.stage_to_device(column, torch.int64, device="cpu")
        return result
    except ValueError as exc:  # a value beyond int64, or an entry's own error: the element's index is the request's
        error = remade(exc, f"write_cache_indices: {name}")
    try:  # as pinstage._fallback raises it: its chain kept, no cycle through this frame
        raise error
    finally:
        del error


def _check_entries(name: str, column: Iterable[Any]) -> None:
    """TypeError naming the first entry that is not an integer (a bool, a float, a str, a tensor of
    another dtype or shape); Python and numpy ints and objects with __index__ pass."""
    for i, value in enumerate(column):
        if isinstance(value, torch.Tensor):
            ok = value.dim() == 0 and is_integer_dtype(value.dtype)
            got = f"a tensor of {value.dtype}"
        else:
            ok = not isinstance(value, (bool, np.bool_)) and hasattr(type(value), "__index__")
            got = type(value).__name__
        if not ok:
            raise TypeError(f"write_cache_indices: request {i}: {name} must be an int, got {got}")
