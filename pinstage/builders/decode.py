"""Per-step decode inputs from a list of requests: last-token ids (also the penalty path's latest
output ids), seq_lens and req_pool_indices, as SGLang's ScheduleBatch.prepare_for_decode makes them."""

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from pinstage._api import Device

from ._checks import NamedValues, checked_bounds, stage_fields
from ._fields import TOKEN_FIELDS, checked_list, missing_field, pool_rows
from .protocols import DecodeRequest, TokenHistory


@dataclass
class DecodeInputs:
    input_ids: torch.Tensor  # int64 [bs]: each request's last token
    seq_lens: torch.Tensor  # int64 [bs]: prompt + output length
    req_pool_indices: torch.Tensor  # int64 [bs]: row of each request in req_to_token


def last_token_ids(requests: Sequence[TokenHistory], where: str = "last_token_ids") -> List[int]:
    """Each request's last output token, or its last prompt token before it has any output (reads
    output_ids and origin_input_ids: TokenHistory)."""
    requests = checked_list(where, requests, "requests")
    try:
        return [(r.output_ids or r.origin_input_ids)[-1] for r in requests]
    except AttributeError:
        raise missing_field(where, requests, TOKEN_FIELDS, "a request") from None
    except IndexError:
        for i, r in enumerate(requests):
            if not r.output_ids and not r.origin_input_ids:
                raise ValueError(
                    f"{where}: request {i}: origin_input_ids and output_ids are both empty, so it has no last token"
                ) from None
        raise


def build_penalty_last_token_ids(
    requests: Sequence[TokenHistory],
    *,
    stream: Optional[torch.cuda.Stream] = None,
    device: Device = None,
) -> torch.Tensor:
    """int64 [bs] of last tokens for the penalizers, for engines whose input ids are already on the
    device (overlap scheduling) and only the penalty path needs the host's copy. Reads
    request.output_ids and request.origin_input_ids (TokenHistory: SGLang's Req has them)."""
    ids_list = last_token_ids(requests, "build_penalty_last_token_ids")
    (ids,) = stage_fields([("last token id", ids_list, torch.int64)], stream, device)
    return ids


def build_decode_inputs(
    requests: Sequence[DecodeRequest],
    *,
    stream: Optional[torch.cuda.Stream] = None,
    device: Device = None,
) -> DecodeInputs:
    """The three per-step decode tensors, staged together (one copy), as SGLang's prepare_for_decode
    makes them. Reads request.origin_input_ids, request.output_ids and the request's req_to_token
    row, `req_pool_idx` or (SGLang 0.5.23) `kv.req_pool_idx` (DecodeRequest): an int (Python or numpy) >= 0,
    ValueError naming the request otherwise."""
    return DecodeInputs(*stage_fields(decode_fields(requests), stream, device))


def decode_fields(requests: Sequence[DecodeRequest]) -> List[NamedValues]:
    """build_decode_inputs's host values, validated: (name, one value per request, dtype) fields in
    DecodeInputs's order."""
    ids = last_token_ids(requests, "build_decode_inputs")
    req_pool_indices = pool_rows("build_decode_inputs", requests)
    if requests:
        # numpy ints as BatchState.add and write_cache_indices take them: the same rows either way.
        checked_bounds(req_pool_indices, "req_pool_idx", lambda v: v >= 0, ">= 0", integer=True, numpy_ints=True)
    return [
        ("last token id", ids, torch.int64),
        ("seq_len", [len(r.origin_input_ids) + len(r.output_ids) for r in requests], torch.int64),
        ("req_pool_idx", req_pool_indices, torch.int64),
    ]
