"""Engine-side batch preparation on pinstage, modelled on SGLang's per-step code.

Every builder takes backend="pinstage" (default), "pinned" or "blocking" and a stream; the three
give equal tensors, so they can be tested and timed side by side.
"""
from ._backend import BACKENDS
from .cache import write_cache_indices
from .decode import DecodeInputs, build_decode_inputs, build_penalty_last_token_ids, last_token_ids
from .logits import LogprobIndices, build_logprob_indices
from .requests import TOP_K_ALL, Request, SamplingParams
from .sampling import DEFAULT_SAMPLING_SEED, SamplingBatch, build_sampling_batch

__all__ = [
    "BACKENDS",
    "DEFAULT_SAMPLING_SEED",
    "DecodeInputs",
    "LogprobIndices",
    "Request",
    "SamplingBatch",
    "SamplingParams",
    "TOP_K_ALL",
    "build_decode_inputs",
    "build_logprob_indices",
    "build_penalty_last_token_ids",
    "build_sampling_batch",
    "last_token_ids",
    "write_cache_indices",
]
