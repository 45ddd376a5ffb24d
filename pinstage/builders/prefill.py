"""stage_prefill: what a prefill stages, in one compiled call. The caller's items (the prompt ids,
positions, out_cache_loc and other lists, the sampling values of sampling_fields) and the logits
processor's index tensors (as build_logprob_indices makes them) go into one ring region and one copy;
where cache rows are given on a device, the copy is one kernel launch that also points req_to_token's
rows at the prefix slots and at out_cache_loc's slots, as write_cache_indices does (above 256 KB of
items, _C.PREFILL_BLOCKS_COPY_MAX_BYTES, the copy engine copies first and that launch writes the
rows; on the CPU: the copy, then write_cache_indices' loop). In a scheduler step each call from
Python costs what its code takes to come back into the caches (docs/design.md, Measuring in a loop): one call
instead of four."""

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch

import pinstage
from pinstage import _C

from .._api import Device
from .cache import IntColumn, write_cache_indices
from .logits import LogprobIndices, logprob_index_tensors


class CacheRows(NamedTuple):
    """write_cache_indices's arguments (cache.py), but out_cache_loc: the index of the staged item
    that holds it (int64, one KV slot per new token); extend_lens are stage_prefill's own."""

    req_to_token: torch.Tensor
    req_pool_indices: IntColumn
    prefix_tensors: Sequence[torch.Tensor]
    prefix_lens: IntColumn
    seq_lens: IntColumn
    out_cache_loc: int


_NO_CACHE_ROWS = (None,) * len(CacheRows._fields)  # _stage_prefill's cache arguments without cache rows


def stage_prefill(
    items: Sequence[Tuple[Any, torch.dtype]],
    extend_seq_lens: IntColumn,
    extend_logprob_start_lens: IntColumn,
    cache_rows: Optional[CacheRows] = None,
    *,
    stream: Optional[torch.cuda.Stream] = None,
    device: Device = None,
) -> Tuple[List[torch.Tensor], LogprobIndices]:
    """([tensor per item, as stage_many gives them], LogprobIndices), staged in one copy; with
    cache_rows, req_to_token's rows written too, on the same stream (on a device by the kernel launch
    that is the copy, or that follows it for items over _C.PREFILL_BLOCKS_COPY_MAX_BYTES). The
    device: stream's, else `device`, else req_to_token's where cache_rows are given, else
    stage_many's default.

    Everything is checked before anything is staged or written, with the errors of stage_many (naming
    the item), build_logprob_indices and write_cache_indices (naming the request), when the
    per-request columns are lists of Python ints; where one is not (a numpy array, a tensor), the
    same calls are made one by one, and an error in the cache rows is then raised after the staging
    (which wastes a ring region; req_to_token is untouched either way). Once the items are written
    only a req_to_token or prefix changed meanwhile (by Python code a conversion ran) can fail;
    nothing is staged or written then. The kernel reads
    the prefix tensors and writes req_to_token on `stream`: as with any op there, freeing them after
    the call is safe where their memory is reused on that stream, not where another stream reuses it
    first (record_stream them, or keep them).
    """
    c = cache_rows
    if c is not None:
        # Before anything else, in one place for every column form: the compiled call reads a None
        # req_to_token as "no cache rows".
        if not issubclass(type(c.req_to_token), torch.Tensor):
            raise TypeError(
                f"pinstage.builders.stage_prefill: req_to_token must be a tensor, got {type(c.req_to_token).__name__}"
            )
        if type(c.out_cache_loc) is not int:
            raise TypeError(
                "pinstage.builders.stage_prefill: out_cache_loc must be the index of an item (an int), got "
                + type(c.out_cache_loc).__name__
            )
        if stream is None and device is None:
            device = c.req_to_token.device
    table, rows, prefixes, prefix_lens, seq_lens, loc = _NO_CACHE_ROWS if c is None else c
    lens, starts = extend_seq_lens, extend_logprob_start_lens
    staged = _C._stage_prefill(items, lens, starts, table, rows, prefixes, prefix_lens, seq_lens, loc, stream, device)
    if staged is None:  # a column other than a list of Python ints: the builders' checked paths
        staged = _one_by_one(list(items), lens, starts, c, stream, device)
    return staged[:-4], LogprobIndices(*staged[-4:])


def _one_by_one(
    items: List[Tuple[Any, torch.dtype]],
    lens: IntColumn,
    starts: IntColumn,
    c: Optional[CacheRows],
    stream: Optional[torch.cuda.Stream],
    device: Device,
) -> List[torch.Tensor]:
    if c is not None and not 0 <= c.out_cache_loc < len(items):
        where = f"out_cache_loc is item {c.out_cache_loc!r} but there are {len(items)} items"
        raise IndexError(f"pinstage.builders.stage_prefill: {where}")
    indices = logprob_index_tensors(lens, starts)
    staged: List[torch.Tensor] = pinstage.stage_many(items + [(t, torch.int64) for t in indices], stream, device=device)
    if c is not None:
        loc = staged[c.out_cache_loc]
        write_cache_indices(
            c.req_to_token, c.req_pool_indices, c.prefix_tensors, c.prefix_lens, c.seq_lens, lens, loc, stream=stream
        )
    return staged
