"""Per-step decode inputs from a list of requests: last-token ids (also the penalty path's latest
output ids), seq_lens and req_pool_indices, as SGLang's ScheduleBatch.prepare_for_decode makes them."""
from dataclasses import dataclass

import torch

from ._checks import checked_bounds, stage_fields


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


def build_penalty_last_token_ids(requests, *, backend="pinstage", stream=None, device=None):
    """int64 [bs] of last tokens for the penalizers, for engines whose input ids are already on the
    device (overlap scheduling) and only the penalty path needs the host's copy. Reads
    request.output_ids and request.origin_input_ids."""
    (ids,) = stage_fields([("last token id", last_token_ids(requests), torch.int64)], backend, stream, device)
    return ids


def build_decode_inputs(requests, *, backend="pinstage", stream=None, device=None):
    """The three per-step decode tensors, staged together (one copy with backend="pinstage"). Reads
    request.origin_input_ids, request.output_ids and request.req_pool_idx (an int >= 0; IndexError
    naming the request otherwise)."""
    req_pool_indices = [r.req_pool_idx for r in requests]
    if requests:
        checked_bounds(req_pool_indices, "req_pool_idx", lambda v: v >= 0, ">= 0", integer=True)
    fields = [
        ("last token id", last_token_ids(requests), torch.int64),
        ("seq_len", [len(r.origin_input_ids) + len(r.output_ids) for r in requests], torch.int64),
        ("req_pool_idx", req_pool_indices, torch.int64),
    ]
    return DecodeInputs(*stage_fields(fields, backend, stream, device))
