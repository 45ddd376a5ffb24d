"""pinstage.builders' results, copied the ways engines copy today (_baselines.stage: "pinned" or
"blocking"): the same validated host values the builders stage in one copy, so that a timing
differs in the copy alone. For the benchmarks (bench/builders.py, bench/decode_loop.py)."""

import numpy as np
import torch
from _baselines import stage

from pinstage.builders import DecodeInputs, LogprobIndices
from pinstage.builders.decode import decode_fields, last_token_ids
from pinstage.builders.logits import logprob_index_tensors
from pinstage.builders.sampling import sampling_fields


def _stage_fields(fields, copy, device):
    return stage([(values, dtype) for _, values, dtype in fields], copy, device)


def build_decode_inputs(requests, copy, device):
    return DecodeInputs(*_stage_fields(decode_fields(requests), copy, device))


def build_penalty_last_token_ids(requests, copy, device):
    (ids,) = stage([(last_token_ids(requests, "build_penalty_last_token_ids"), torch.int64)], copy, device)
    return ids


def build_sampling_batch(params, copy, device, enable_deterministic_sampling=False):
    return stage_sampling_fields(*sampling_fields(params, enable_deterministic_sampling), copy, device)


def stage_sampling_fields(fields, make_batch, copy, device):
    """A SamplingBatch of sampling_fields' values (of a request list or of a BatchState)."""
    return make_batch(_stage_fields(fields, copy, device))


def build_logprob_indices(extend_seq_lens, extend_logprob_start_lens, copy, device):
    tensors = logprob_index_tensors(extend_seq_lens, extend_logprob_start_lens)
    return LogprobIndices(*stage([(t, torch.int64) for t in tensors], copy, device))


def write_cache_indices(
    req_to_token, req_pool_indices, prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc, copy
):
    """The per-request values and each request's offset in out_cache_loc (planned with numpy) copied
    to req_to_token's device, then pinstage's op reads them there. The kernel skips a request whose
    device values are out of bounds, and nothing here checks them: valid batches only."""
    extend = np.asarray(extend_lens, dtype=np.int64)
    offsets = np.zeros_like(extend)
    np.cumsum(extend[:-1], out=offsets[1:])
    columns = [np.asarray(v, dtype=np.int64) for v in (req_pool_indices, prefix_lens, seq_lens)]
    rows, prefixes, lengths, offsets = stage([(v, torch.int64) for v in (*columns, offsets)], copy, req_to_token.device)
    torch.ops.pinstage.write_cache_indices(
        req_to_token, rows, list(prefix_tensors), prefixes, lengths, offsets, out_cache_loc
    )
