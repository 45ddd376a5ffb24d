"""write_cache_indices: point each request's row of req_to_token at its KV slots, as SGLang's
mem_cache write_cache_indices does before a prefill: the cached prefix's slots at
[0, prefix_len), the newly allocated slots (its slice of out_cache_loc) at [prefix_len, seq_len)."""
import torch

from .. import _C
from ._backend import check_backend, stage


def write_cache_indices(
    req_to_token,
    req_pool_indices,
    prefix_tensors,
    prefix_lens,
    seq_lens,
    extend_lens,
    out_cache_loc,
    *,
    backend="pinstage",
    stream=None,
):
    """req_to_token: int32 [rows, max_context_len]; out_cache_loc: int64 [sum(extend_lens)]; both on
    one device. req_pool_indices, prefix_lens, seq_lens, extend_lens: lists of ints, one per request.
    prefix_tensors: one int64 1-D tensor per request on that device, at least prefix_len long.

    Everything is validated on the host before anything is staged or written (IndexError for a row
    outside req_to_token, TypeError for a wrong dtype, ValueError otherwise; messages name the request
    and the field). On CUDA it is one kernel launch on `stream` (default: the current stream) and the
    host does not wait; the prefix tensors must stay alive until that stream has run the kernel.
    """
    check_backend(backend)
    # Held for the whole call: the kernel reads the prefixes through raw pointers, and reading the
    # int lists can run Python code (an __index__) that might drop the caller's only reference.
    prefix_tensors = tuple(prefix_tensors)
    if backend == "pinstage":
        # Validated and staged in one step: the request fields and the plan go from C++ vectors
        # into one ring region and one copy, without Python lists in between.
        staged = _C._stage_cache_index_plan(
            req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc, stream
        )
    else:
        staged = stage_cache_index_plan_lists(
            req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc,
            backend, stream,
        )
    rows, prefixes, lengths, offsets, pointers = staged
    _C.write_cache_indices(req_to_token, rows, pointers, prefixes, lengths, offsets, out_cache_loc, stream)


def stage_cache_index_plan_lists(
    req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc, backend, stream
):
    """The plan as Python lists, staged by `backend`: what the "pinned" and "blocking" backends do.
    Returns [req_pool_indices, prefix_lens, seq_lens, out_cache_offsets, prefix_pointers]."""
    # The kernel reaches each prefix through its data pointer: only the host can still check its
    # device, dtype and length, so cache_index_plan does that before taking the pointers.
    prefix_pointers, out_cache_offsets = _C.cache_index_plan(
        req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc
    )
    return stage(
        [
            (req_pool_indices, torch.int64),
            (prefix_lens, torch.int64),
            (seq_lens, torch.int64),
            (out_cache_offsets, torch.int64),
            (prefix_pointers, torch.uint64),
        ],
        backend,
        stream,
        req_to_token.device,
    )
