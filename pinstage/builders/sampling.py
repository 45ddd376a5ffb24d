"""Per-batch sampling tensors and flags, as SGLang's SamplingBatchInfo.from_schedule_batch builds them."""
from dataclasses import dataclass
from typing import Optional

import torch

from .. import _C
from ._backend import stage
from ._checks import checked_bounds
from .requests import TOP_K_ALL

# The seed a request without one gets when deterministic sampling is on (SGLang's default).
DEFAULT_SAMPLING_SEED = 42


@dataclass
class SamplingBatch:
    temperatures: torch.Tensor  # float32 [bs, 1]
    top_ps: torch.Tensor  # float32 [bs]
    top_ks: torch.Tensor  # int32 [bs]
    min_ps: torch.Tensor  # float32 [bs]
    seeds: Optional[torch.Tensor]  # int64 [bs], only with deterministic sampling
    is_all_greedy: bool  # every top_k <= 1
    need_top_p: bool  # some top_p != 1
    need_top_k: bool  # some top_k != TOP_K_ALL
    need_min_p: bool  # some min_p > 0


def sampling_items(params, enable_deterministic_sampling=False):
    """The Python gather: ([(values, dtype), ...] as host lists, (is_all_greedy, need_top_p,
    need_top_k, need_min_p)), validated. The "pinned" and "blocking" backends stage these;
    "pinstage" gathers natively and uses this only for what its gather declines."""
    temperatures = [p.temperature for p in params]
    top_ps = [p.top_p for p in params]
    top_ks = [p.top_k for p in params]
    min_ps = [p.min_p for p in params]
    if params:
        checked_bounds(temperatures, "temperature", lambda v: v >= 0, ">= 0")
        top_p_min, _ = checked_bounds(top_ps, "top_p", lambda v: 0 < v <= 1, "in (0, 1]")
        top_k_min, top_k_max = checked_bounds(
            top_ks, "top_k", lambda v: v >= 1, f">= 1, or TOP_K_ALL ({TOP_K_ALL}) for all"
        )
        _, min_p_max = checked_bounds(min_ps, "min_p", lambda v: 0 <= v <= 1, "in [0, 1]")
        flags = (top_k_max <= 1, top_p_min < 1, top_k_min != TOP_K_ALL or top_k_max != TOP_K_ALL, min_p_max > 0)
    else:
        flags = (True, False, False, False)

    items = [
        (temperatures, torch.float32),
        (top_ps, torch.float32),
        (top_ks, torch.int32),
        (min_ps, torch.float32),
    ]
    if enable_deterministic_sampling:
        seeds = [DEFAULT_SAMPLING_SEED if p.sampling_seed is None else p.sampling_seed for p in params]
        items.append((seeds, torch.int64))
    return items, flags


def stage_sampling_items(params, enable_deterministic_sampling, backend, stream=None, device=None):
    """The Python gather staged by `backend`: (tensors with temperatures as [bs, 1], flags)."""
    items, flags = sampling_items(params, enable_deterministic_sampling)
    tensors = stage(items, backend, stream, device)
    tensors[0] = tensors[0].view(-1, 1)
    return tensors, flags


def build_sampling_batch(
    params, *, enable_deterministic_sampling=False, backend="pinstage", stream=None, device=None
):
    """params: one SamplingParams per request, in batch order. All tensors staged in one stage_many
    (with backend="pinstage", gathered and checked in C++ and staged in one copy).

    Raises ValueError (TypeError for a non-number) naming the request and the field when
    temperature < 0, top_p outside (0, 1], top_k < 1 (TOP_K_ALL, or -1 at construction, means all),
    or min_p outside [0, 1].
    """
    staged = None
    if backend == "pinstage":
        # None when the C++ gather declines (a value it does not convert as Python would, or an
        # invalid one): the Python gather then stages it or raises the error naming the request.
        staged = _C._stage_sampling_batch(
            params, enable_deterministic_sampling, TOP_K_ALL, DEFAULT_SAMPLING_SEED, stream, device
        )
    if staged is not None:
        tensors, *flags = staged
    else:
        tensors, flags = stage_sampling_items(params, enable_deterministic_sampling, backend, stream, device)
    is_all_greedy, need_top_p, need_top_k, need_min_p = flags
    return SamplingBatch(
        temperatures=tensors[0],
        top_ps=tensors[1],
        top_ks=tensors[2],
        min_ps=tensors[3],
        seeds=tensors[4] if enable_deterministic_sampling else None,
        is_all_greedy=is_all_greedy,
        need_top_p=need_top_p,
        need_top_k=need_top_k,
        need_min_p=need_min_p,
    )
