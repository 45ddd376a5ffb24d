"""Index tensors of the logits processor for prefill with input logprobs, following SGLang's
LogitsProcessor._get_pruned_states / _expand_metadata_for_logprobs.

Request i contributes extend_seq_lens[i] hidden-state rows; from row extend_logprob_start_lens[i] on
it wants input logprobs. A request whose start equals its length (chunked prefill) still keeps its
last row, to sample from. Worked example: lens [4, 5, 6], starts [0, 5, 3] give
  pruned_row_indices    [0, 1, 2, 3, 8, 12, 13, 14]   rows of the hidden states that are kept
  sample_indices        [3, 4, 7]                     each request's last kept row, in kept order
  input_logprob_indices [0, 1, 2, 3, 5, 6, 7]         kept rows that carry an input logprob
  pruned_lens           [4, 1, 3]                     rows kept per request
"""
import numbers
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import add, eq, sub

import numpy as np
import torch

from .. import _C
from ._backend import stage

# Below this batch size the itertools version is cheaper (numpy's fixed cost per call dominates);
# above it numpy's vector ops are (measured: equal near bs 32, numpy 4x cheaper at bs 256).
_NUMPY_FROM_BATCH_SIZE = 32


@dataclass
class LogprobIndices:
    sample_indices: torch.Tensor  # int64 [bs]
    input_logprob_indices: torch.Tensor  # int64 [total input logprobs]
    pruned_lens: torch.Tensor  # int64 [bs]
    pruned_row_indices: torch.Tensor  # int64 [sum(pruned_lens)]


def _indices_from_lists(lens, starts):
    sample_only = list(map(eq, starts, lens))  # start == len: keep one row to sample from
    kept_from = list(map(sub, starts, sample_only))
    pruned_lens = list(map(sub, lens, kept_from))
    ends = list(accumulate(lens))
    rows = list(chain.from_iterable(map(range, map(sub, ends, pruned_lens), ends)))
    kept_before = list(accumulate(pruned_lens, initial=0))
    sample_indices = list(accumulate(pruned_lens, initial=-1))
    del sample_indices[0]
    logprob_ends = map(add, kept_before, map(sub, lens, starts))
    input_logprob = list(chain.from_iterable(map(range, kept_before, logprob_ends)))
    return sample_indices, input_logprob, pruned_lens, rows


def _indices_from_arrays(len_list, start_list):
    # Inferred, not forced, dtype: a float or str length must be an error, not truncated or parsed.
    lens = np.asarray(len_list)
    starts = np.asarray(start_list)
    if lens.dtype.kind != "i" or starts.dtype.kind != "i":
        _raise_first_invalid(len_list, start_list)
    logprob_lens = lens - starts
    if lens.min() < 1 or starts.min() < 0 or logprob_lens.min() < 0:
        _raise_first_invalid(len_list, start_list)
    sample_only = starts == lens
    kept_from = starts - sample_only
    pruned_lens = lens - kept_from
    sample_indices = pruned_lens.cumsum()
    total_kept = int(sample_indices[-1])
    sample_indices -= 1
    # Kept row k of request i is hidden row k + (rows request 0..i dropped at their fronts).
    rows = np.repeat(kept_from.cumsum(), pruned_lens)
    rows += np.arange(total_kept)
    # Input-logprob entry k of request i is kept row k + (sample-only rows of requests before i).
    sample_only_before = sample_only.cumsum() - sample_only
    input_logprob = np.repeat(sample_only_before, logprob_lens)
    input_logprob += np.arange(input_logprob.size)
    return sample_indices, input_logprob, pruned_lens, rows


def _check_lists(lens, starts):
    try:
        ok = not lens or (min(lens) >= 1 and min(starts) >= 0 and min(map(sub, lens, starts)) >= 0)
    except TypeError:
        ok = False
    if not ok:
        _raise_first_invalid(lens, starts)


def _raise_first_invalid(lens, starts):
    for i, (n, s) in enumerate(zip(lens, starts)):
        if not isinstance(n, numbers.Integral) or not isinstance(s, numbers.Integral):
            raise TypeError(
                f"request {i}: extend_seq_lens and extend_logprob_start_lens must be ints, "
                f"got {type(n).__name__} and {type(s).__name__}"
            )
        if n < 1:
            raise ValueError(f"request {i}: extend_seq_lens must be >= 1, got {n}")
        if not 0 <= s <= n:
            raise ValueError(
                f"request {i}: extend_logprob_start_lens must be in [0, extend_seq_lens={n}], got {s}"
            )
    raise TypeError("extend_seq_lens and extend_logprob_start_lens must be lists of ints")


def logprob_index_values(extend_seq_lens, extend_logprob_start_lens):
    """The Python computation: (sample_indices, input_logprob_indices, pruned_lens,
    pruned_row_indices) as lists or int64 numpy arrays, validated. The "pinned" and "blocking"
    backends stage these; "pinstage" computes them in C++."""
    lens, starts = extend_seq_lens, extend_logprob_start_lens
    if len(lens) >= _NUMPY_FROM_BATCH_SIZE:
        return _indices_from_arrays(lens, starts)
    _check_lists(lens, starts)
    try:
        return _indices_from_lists(lens, starts)
    except TypeError:  # a float length passes min() but not range()
        _raise_first_invalid(lens, starts)


def build_logprob_indices(
    extend_seq_lens, extend_logprob_start_lens, *, backend="pinstage", stream=None, device=None
):
    """Lists of ints (one per request) -> LogprobIndices, the four tensors staged in one copy.

    Raises ValueError naming the request when a length is < 1 or a start is outside [0, length],
    TypeError when one is not an int.
    """
    lens, starts = extend_seq_lens, extend_logprob_start_lens
    if len(lens) != len(starts):
        raise ValueError(f"extend_seq_lens has {len(lens)} entries but extend_logprob_start_lens has {len(starts)}")
    if backend == "pinstage":
        # One pass in C++ straight to the staged arrays; None (declined) for anything but valid
        # lists of ints, which the Python computation below then handles or rejects.
        staged = _C._stage_logprob_indices(lens, starts, stream, device)
        if staged is not None:
            return LogprobIndices(*staged)
    values = logprob_index_values(lens, starts)
    tensors = stage([(v, torch.int64) for v in values], backend, stream, device)
    return LogprobIndices(*tensors)
