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

import numpy as np
import torch

from ._backend import stage


@dataclass
class LogprobIndices:
    sample_indices: torch.Tensor  # int64 [bs]: row of each request's sampling position among the kept rows
    input_logprob_indices: torch.Tensor  # int64 [sum(pruned_lens)]: kept rows that carry an input logprob
    pruned_lens: torch.Tensor  # int64 [bs]: input-logprob rows per request (extend_len - start)
    pruned_row_indices: torch.Tensor  # int64 [kept rows]: hidden-state rows kept for the logits


def logprob_index_arrays(extend_seq_lens, extend_logprob_start_lens):
    """(sample_indices, input_logprob_indices, pruned_lens, pruned_row_indices) as int64 numpy
    arrays from per-request lengths (lists of ints or integer numpy arrays), validated.

    Raises ValueError naming the request when a length is < 1 or a start is outside [0, length],
    TypeError when one is not an integer.
    """
    # Inferred, not forced, dtypes: a float or str length must be an error, not truncated or parsed.
    lens = np.asarray(extend_seq_lens)
    starts = np.asarray(extend_logprob_start_lens)
    if lens.shape != starts.shape or lens.ndim != 1:
        raise ValueError(
            f"extend_seq_lens has {len(extend_seq_lens)} entries but extend_logprob_start_lens has "
            f"{len(extend_logprob_start_lens)}"
        )
    if lens.dtype.kind not in "iu" or starts.dtype.kind not in "iu":
        if lens.size:
            _raise_first_invalid(extend_seq_lens, extend_logprob_start_lens)
        lens, starts = lens.astype(np.int64), starts.astype(np.int64)
    pruned_lens = np.subtract(lens, starts, dtype=np.int64)  # input-logprob rows
    if lens.size and (lens.min() < 1 or starts.min() < 0 or pruned_lens.min() < 0):
        _raise_first_invalid(lens.tolist(), starts.tolist())
    sample_only = pruned_lens == 0  # start == length: no input logprob, the last row kept to sample from
    kept_lens = pruned_lens + sample_only
    kept_ends = kept_lens.cumsum()
    sample_indices = kept_ends - 1
    total_kept = int(kept_ends[-1]) if lens.size else 0
    # Kept row k of request i is hidden row k + (rows that requests 0..i dropped at their fronts).
    pruned_rows = np.repeat((lens - kept_lens).cumsum(), kept_lens)
    pruned_rows += np.arange(total_kept)
    # Input-logprob row k of request i is kept row k + (sample-only rows of requests before i).
    sample_only_before = sample_only.cumsum() - sample_only
    input_logprob = np.repeat(sample_only_before, pruned_lens)
    input_logprob += np.arange(input_logprob.size)
    return sample_indices, input_logprob, pruned_lens, pruned_rows


def _raise_first_invalid(lens, starts):
    for i, (n, s) in enumerate(zip(lens, starts)):
        if not _is_int(n) or not _is_int(s):
            raise TypeError(
                f"request {i}: extend_seq_lens and extend_logprob_start_lens must be ints, "
                f"got {type(n).__name__} and {type(s).__name__}"
            )
        if n < 1:
            raise ValueError(f"request {i}: extend_seq_lens must be >= 1, got {n}")
        if not 0 <= s <= n:
            raise ValueError(f"request {i}: extend_logprob_start_lens must be in [0, extend_seq_lens={n}], got {s}")
    raise TypeError("extend_seq_lens and extend_logprob_start_lens must be sequences of ints")


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def build_logprob_indices(extend_seq_lens, extend_logprob_start_lens, *, backend="pinstage", stream=None, device=None):
    """Per-request lengths (lists of ints or integer numpy arrays) -> LogprobIndices, the four
    int64 tensors staged together (one copy with backend="pinstage").

    Raises ValueError naming the request when a length is < 1 or a start is outside [0, length],
    TypeError when one is not an int; nothing is staged then.
    """
    arrays = logprob_index_arrays(extend_seq_lens, extend_logprob_start_lens)
    return LogprobIndices(*stage([(a, torch.int64) for a in arrays], backend, stream, device))
