"""Reading the fields of protocols.py off an engine's objects, with a TypeError naming what was
expected when an object lacks one (instead of an AttributeError from deep inside a builder)."""

from collections.abc import Sequence as SequenceABC
from typing import Any, List, Optional, Sequence, Tuple

TOKEN_FIELDS = ("origin_input_ids", "output_ids")


def checked_list(where: str, items: object, what: str) -> Sequence[Any]:
    """`items` if it is a list-like of objects (the builders read it more than once, so an iterator
    would be consumed by the first pass); TypeError naming `what` was expected otherwise."""
    if isinstance(items, (str, bytes)) or not isinstance(items, SequenceABC):
        raise TypeError(f"{where}: expected a list of {what}, one per request, got {type(items).__name__}")
    return items


def missing_field(where: str, items: Sequence[Any], fields: Sequence[str], what: str) -> TypeError:
    """The TypeError for the first item that lacks one of `fields`, naming the request (the caller
    saw an AttributeError while gathering them)."""
    for i, item in enumerate(items):
        error = lacks_field(f"{where}: request {i}", item, fields, what)
        if error is not None:
            return error
    return TypeError(f"{where}: reading {', '.join(fields)} raised AttributeError")


def lacks_field(where: str, item: Any, fields: Sequence[str], what: str) -> Optional[TypeError]:
    """A TypeError naming what was expected if `item` lacks one of `fields`, else None."""
    for name in fields:
        if not hasattr(item, name):
            return TypeError(
                f"{where}: expected {what} with {', '.join(fields)}, got {type(item).__name__} without {name}"
            )
    return None


def pool_rows(where: str, requests: Sequence[Any]) -> List[Optional[int]]:
    """Each request's req_to_token row: `req.req_pool_idx` (pinstage's Request, SGLang before
    0.5.23) or `req.kv.req_pool_idx` (SGLang 0.5.23's Req)."""
    try:
        return [r.req_pool_idx for r in requests]
    except AttributeError:
        pass
    try:
        return [r.kv.req_pool_idx for r in requests]
    except AttributeError:
        pass
    return [pool_row(f"{where}: request {i}", r) for i, r in enumerate(requests)]  # mixed shapes, or one without


def pool_row(where: str, request: Any) -> Optional[int]:
    """One request's req_to_token row (see pool_rows); TypeError naming both places otherwise."""
    holder: Any = request if hasattr(request, "req_pool_idx") else getattr(request, "kv", None)
    if hasattr(holder, "req_pool_idx"):
        row: Optional[int] = holder.req_pool_idx
        return row
    raise TypeError(f"{where}: expected a request with req_pool_idx or kv.req_pool_idx, got {type(request).__name__}")


def penalty_row(params: Any) -> Tuple[float, float, float]:
    """(frequency, presence, repetition): one row of SamplingBatch.penalties."""
    return (params.frequency_penalty, params.presence_penalty, params.repetition_penalty)
