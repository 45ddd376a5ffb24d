"""Per-step decode inputs: last-token ids (also the penalty path's latest output ids), seq_lens and
req_pool_indices, as SGLang's ScheduleBatch.prepare_for_decode stages them from host lists."""
from dataclasses import dataclass

import torch

from .. import _C
from ._backend import stage


@dataclass
class DecodeInputs:
    input_ids: torch.Tensor  # int64 [bs]: each request's last token
    seq_lens: torch.Tensor  # int64 [bs]: prompt + output length
    req_pool_indices: torch.Tensor  # int64 [bs]: row of each request in req_to_token


def last_token_ids(requests):
    """Each request's last output token, or its last prompt token before it has any output."""
    try:
        return [(r.output_ids or r.origin_input_ids)[-1] for r in requests]
    except IndexError:
        for i, r in enumerate(requests):
            if not r.output_ids and not r.origin_input_ids:
                raise ValueError(
                    f"request {i}: origin_input_ids and output_ids are both empty, so it has no last token"
                ) from None
        raise


def decode_input_items(requests):
    """The Python gather: [(input_ids, int64), (seq_lens, int64), (req_pool_indices, int64)] as host
    lists, validated. The "pinned" and "blocking" backends stage these; "pinstage" gathers natively."""
    input_ids = last_token_ids(requests)
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) for r in requests]
    req_pool_indices = [r.req_pool_idx for r in requests]
    if req_pool_indices and min(req_pool_indices) < 0:
        i = next(i for i, row in enumerate(req_pool_indices) if row < 0)
        raise IndexError(f"request {i}: req_pool_idx must be >= 0, got {req_pool_indices[i]}")
    return [(input_ids, torch.int64), (seq_lens, torch.int64), (req_pool_indices, torch.int64)]


def build_penalty_last_token_ids(requests, *, backend="pinstage", stream=None, device=None):
    """int64 [bs] of last tokens for the penalizers, for engines whose input ids are already on the
    device (overlap scheduling) and only the penalty path needs the host's copy."""
    if backend == "pinstage":
        # C++ reads the requests and stages in one copy; it declines (None) anything unusual, and
        # the Python gather below then stages it or raises its error.
        staged = _C._stage_last_token_ids(requests, stream, device)
        if staged is not None:
            return staged
    (ids,) = stage([(last_token_ids(requests), torch.int64)], backend, stream, device)
    return ids


def build_decode_inputs(requests, *, backend="pinstage", stream=None, device=None):
    """The three per-step decode tensors, staged together (one copy with backend="pinstage")."""
    if backend == "pinstage":
        staged = _C._stage_decode_inputs(requests, stream, device)
        if staged is not None:
            return DecodeInputs(*staged)
    return DecodeInputs(*stage(decode_input_items(requests), backend, stream, device))
