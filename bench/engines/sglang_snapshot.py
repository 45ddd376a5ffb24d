"""What SGLang keeps of a batch after a step, as plain data that == compares exactly: the
integration tests and bench/sglang_loop.py compare SGLang as shipped with pinstage enabled by it."""

import dataclasses
import enum
from array import array

import torch

_OPAQUE = object()
_SCALARS = {bool, int, float, str, type(None)}


class Exact:
    """A tensor captured for exact comparison: device, dtype, shape and every value (a copy on the
    tensor's own device, taken in stream order: nothing waits, and a large batch's penalizer
    state is not copied to the host)."""

    def __init__(self, tensor):
        self.meta = (str(tensor.device), tensor.dtype, tuple(tensor.shape), tensor.is_pinned())
        self.values = tensor.detach().clone()

    def __eq__(self, other):
        return isinstance(other, Exact) and self.meta == other.meta and torch.equal(self.values, other.values)

    def __repr__(self):
        return f"Exact{self.meta}({self.values.flatten()[:16].tolist()}...)"


def plain(value):
    """A value as data that == compares exactly: a tensor becomes an Exact; objects that are not
    data (pools, caches, requests) become _OPAQUE."""
    if isinstance(value, torch.Tensor):
        return Exact(value)
    if isinstance(value, (bool, int, float, str, type(None), enum.Enum)):
        return value
    if isinstance(value, array):
        return ("array", value.typecode, value.tolist())
    if isinstance(value, (list, tuple)):
        if all(type(v) in _SCALARS for v in value):  # per-request numbers: already plain
            return (type(value).__name__, list(value))
        return (type(value).__name__, [plain(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: plain(v) for k, v in value.items()})
    return _OPAQUE


def plain_fields(obj, names):
    out = {}
    for name in names:
        value = plain(getattr(obj, name, None))
        if value is not _OPAQUE:
            out[name] = value
    return out


def snapshot(batch):
    """Everything SGLang keeps of a batch after a step, as plain data: its fields, its requests'
    progress, its rows of the request-to-token table, its sampling info and penalizer state."""
    out = plain_fields(batch, [f.name for f in dataclasses.fields(batch)])
    out["reqs"] = [  # each request's progress (output_ids copied: the request appends to it)
        (
            r.rid,
            r.prefix_len,
            r.extend_end,
            r.output_ids[:],
            r.cached_tokens,
            r.already_computed,
            r.logprob_start_len,
            r.kv.req_pool_idx,
        )
        for r in batch.reqs
    ]
    rows = batch.req_pool_indices_cpu
    out["req_to_token"] = plain(batch.req_to_token_pool.req_to_token[rows]) if rows is not None else None
    info = batch.sampling_info
    if info is not None:
        out["sampling_info"] = plain_fields(info, [f.name for f in dataclasses.fields(info)])
        orchestrator = info.penalizer_orchestrator
        out["penalizers"] = {"is_required": orchestrator.is_required} | {
            type(p).__name__: plain_fields(p, sorted(vars(p))) for p in orchestrator.penalizers.values()
        }
    return out
