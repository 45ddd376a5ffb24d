"""Engine-side batch preparation on pinstage, modelled on SGLang's per-step code.

Two shapes that give equal tensors:
- BatchState: the batch's per-request values in persistent numpy columns, updated when requests join
  and leave and when tokens come back; each per-step builder is one stage_many of column slices.
- Builders over a list of request objects (SGLang's shape, drop-in: SGLang's own Req and
  SamplingParams are accepted as they are; protocols.py lists the fields each builder reads): a Python gather plus one
  stage_many.
A prefill stages everything in one call: stage_prefill takes its lists, the sampling values of
sampling_fields (validated host values, and how to assemble the SamplingBatch) and the lengths the
logits indices come from, stages them in one copy and writes the cache rows (on a device, one kernel
launch does both).
"""

from .batch_state import BatchState
from .cache import write_cache_indices
from .decode import DecodeInputs, build_decode_inputs, build_penalty_last_token_ids, last_token_ids
from .logits import LogprobIndices, build_logprob_indices, logprob_index_tensors
from .prefill import CacheRows, stage_prefill
from .protocols import (
    BatchRequest,
    DecodeRequest,
    KvRequest,
    PoolRow,
    RowRequest,
    SampledKvRequest,
    SampledRowRequest,
    SamplingFields,
    TokenHistory,
)
from .requests import TOP_K_ALL, Request, SamplingParams
from .sampling import DEFAULT_SAMPLING_SEED, SamplingBatch, build_sampling_batch, sampling_fields
from .static_step import BATCH_STATE_FIELDS, batch_static_inputs

__all__ = [
    "BATCH_STATE_FIELDS",
    "BatchRequest",
    "BatchState",
    "CacheRows",
    "DEFAULT_SAMPLING_SEED",
    "DecodeInputs",
    "DecodeRequest",
    "KvRequest",
    "LogprobIndices",
    "PoolRow",
    "Request",
    "RowRequest",
    "SampledKvRequest",
    "SampledRowRequest",
    "SamplingBatch",
    "SamplingFields",
    "SamplingParams",
    "TOP_K_ALL",
    "TokenHistory",
    "batch_static_inputs",
    "build_decode_inputs",
    "build_logprob_indices",
    "build_penalty_last_token_ids",
    "build_sampling_batch",
    "last_token_ids",
    "logprob_index_tensors",
    "sampling_fields",
    "stage_prefill",
    "write_cache_indices",
]
