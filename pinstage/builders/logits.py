"""Index tensors of the logits processor for a prefill with input logprobs, as SGLang's
LogitsProcessor computes them from extend_seq_lens and extend_logprob_start_lens.

Request i contributes extend_seq_lens[i] hidden-state rows and wants input logprobs from row
extend_logprob_start_lens[i] on. A request whose start equals its length (chunked prefill) has no
input logprob but still keeps its last row, to sample from. Worked example (upstream's own):
lens [4, 5, 6], starts [0, 5, 3] give
  pruned_row_indices    [0, 1, 2, 3, 8, 12, 13, 14]   hidden-state rows that are kept
  sample_indices        [3, 4, 7]                     each request's last kept row, in kept order
  input_logprob_indices [0, 1, 2, 3, 5, 6, 7]         kept rows that carry an input logprob
  pruned_lens           [4, 0, 3]                     input-logprob rows per request
so that sum(pruned_lens) == len(input_logprob_indices), which upstream relies on when it expands
per-request values over the input-logprob rows (repeat_interleave of temperatures by pruned_lens).
"""

from dataclasses import dataclass
from typing import Any, NoReturn, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt
import torch

import pinstage
from pinstage import _C

from .._api import Device
from ._checks import is_integer_dtype, is_integer_entry, is_plain_int_list, plain_int_array, require_host_tensor
from .cache import IntColumn


@dataclass
class LogprobIndices:
    sample_indices: torch.Tensor  # int64 [bs]: row of each request's sampling position among the kept rows
    input_logprob_indices: torch.Tensor  # int64 [sum(pruned_lens)]: kept rows that carry an input logprob
    pruned_lens: torch.Tensor  # int64 [bs]: input-logprob rows per request (extend_len - start)
    pruned_row_indices: torch.Tensor  # int64 [kept rows]: hidden-state rows kept for the logits


def logprob_index_tensors(
    extend_seq_lens: IntColumn, extend_logprob_start_lens: IntColumn
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sample_indices, input_logprob_indices, pruned_lens, pruned_row_indices) as CPU int64 tensors
    from per-request lengths (lists of ints, integer numpy arrays or CPU integer tensors), validated.

    Raises ValueError naming the request when a length is < 1 or beyond int64 or a start is outside
    [0, length], TypeError when one is not an integer or a column is not a list.
    """
    if _is_int64_column(extend_seq_lens) and _is_int64_column(extend_logprob_start_lens):  # an engine's usual call
        try:
            return _C.logprob_indices(extend_seq_lens, extend_logprob_start_lens)
        except (ValueError, RuntimeError):
            pass  # a value beyond int64 or out of range: the checked path below names the request
    lens = _column("extend_seq_lens", extend_seq_lens)
    starts = _column("extend_logprob_start_lens", extend_logprob_start_lens)
    if lens.size != starts.size:
        raise ValueError(f"extend_seq_lens has {lens.size} entries but extend_logprob_start_lens has {starts.size}")
    # Checked on the values given: a cast to int64 first would wrap uint64 2**64 - 1 to -1.
    if lens.size:
        if lens.dtype.kind not in "iu" or starts.dtype.kind not in "iu":
            _raise_first_invalid(lens.tolist(), starts.tolist())  # an object column holds the entries as given
        if np.uint64 in (lens.dtype, starts.dtype) and max(lens.max(), starts.max()) > _INT64_MAX:
            _raise_first_invalid(lens.tolist(), starts.tolist())
    # The index arithmetic is one pass in C++ (numpy's ~20 whole-array operations cost more than the
    # staging at small batches), reached without torch's dispatcher or torch.from_numpy: in a
    # scheduler step each layer of code a call runs costs microseconds (docs/design.md).
    return _C.logprob_indices(np.ascontiguousarray(lens, dtype=np.int64), np.ascontiguousarray(starts, dtype=np.int64))


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int64_column(values: object) -> bool:
    """A plain int list or a 1-D signed-integer numpy array: what the compiled core converts to
    int64 as given, or refuses (a value beyond int64)."""
    return is_plain_int_list(values) or (type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind == "i")


def _column(name: str, values: object) -> npt.NDArray[Any]:
    """One entry per request as a 1-D numpy array: a numeric array as it is (its dtype checked by
    the caller), anything else entry by entry: int64 when every entry is an int (a Python or numpy
    int, not a bool) that int64 holds, else an object array of the entries as given, which the
    caller's walk names (numpy would make [np.uint64(5), 3] float64 and [True, 2] ints)."""
    given = values  # its type names it in the error, whatever it is read as
    if isinstance(values, torch.Tensor):
        require_host_tensor(name, values)  # as write_cache_indices takes its columns; the dtype: the caller's
        values = values.resolve_neg().numpy() if is_integer_dtype(values.dtype) else values.tolist()
    if isinstance(values, np.ndarray) and values.dtype.kind != "O":
        nested = values.ndim > 1
        column = values if values.ndim == 1 else None
    elif (plain := plain_int_array(values)) is not None:  # the usual list
        return plain
    else:
        try:
            entries = list(values)  # type: ignore[call-overload]
        except TypeError:  # not iterable: a scalar (a 0-d array too)
            entries = None
        nested = entries is not None and any(isinstance(v, (list, tuple, np.ndarray)) for v in entries)
        column = None
        if entries is not None and not nested:
            column = np.empty(len(entries), dtype=object)
            column[:] = entries
            if all(is_integer_entry(v) and _INT64_MIN <= v <= _INT64_MAX for v in entries):
                column = column.astype(np.int64)
    if column is None:
        raise TypeError(
            f"{name} must be a list of ints, one per request, got {'nested' if nested else 'a scalar'} "
            f"{type(given).__name__}"
        )
    return column


def _raise_first_invalid(lens: Sequence[Any], starts: Sequence[Any]) -> NoReturn:
    for i, (n, s) in enumerate(zip(lens, starts)):
        for name, value in (("extend_seq_lens", n), ("extend_logprob_start_lens", s)):
            if not is_integer_entry(value):
                raise TypeError(f"request {i}: {name} must be an int, got {type(value).__name__} {value!r}")
        if n < 1:
            raise ValueError(f"request {i}: extend_seq_lens must be >= 1, got {n}")
        if n > _INT64_MAX:
            raise ValueError(f"request {i}: extend_seq_lens must fit int64 (at most 2**63 - 1), got {n}")
        if not 0 <= s <= n:
            raise ValueError(f"request {i}: extend_logprob_start_lens must be in [0, extend_seq_lens={n}], got {s}")
    raise AssertionError("the lengths failed the batch check but no request fails it")


def build_logprob_indices(
    extend_seq_lens: IntColumn,
    extend_logprob_start_lens: IntColumn,
    *,
    stream: Optional[torch.cuda.Stream] = None,
    device: Device = None,
) -> LogprobIndices:
    """Per-request lengths (lists of ints, integer numpy arrays or CPU integer tensors) -> LogprobIndices, the four
    int64 tensors staged together (one copy).

    Raises ValueError naming the request when a length is < 1 or a start is outside [0, length],
    TypeError when one is not an int; nothing is staged then.
    """
    tensors = logprob_index_tensors(extend_seq_lens, extend_logprob_start_lens)
    return LogprobIndices(*pinstage.stage_many([(t, torch.int64) for t in tensors], stream, device=device))
