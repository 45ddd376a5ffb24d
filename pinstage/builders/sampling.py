"""Per-batch sampling tensors and flags from a list of SamplingParams, as SGLang's
SamplingBatchInfo.from_schedule_batch builds them."""

import functools
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from pinstage._api import Device

from ._checks import NamedValues, checked_bounds, stage_fields
from ._fields import checked_list, missing_field, penalty_row
from .protocols import SamplingFields
from .requests import NO_PENALTIES, SAMPLING_FIELDS, SAMPLING_RULES, TOP_K_ALL

# The seed a request without one gets when deterministic sampling is on (SGLang's default).
DEFAULT_SAMPLING_SEED = 42


@dataclass
class SamplingBatch:
    temperatures: torch.Tensor  # float32 [bs, 1]
    top_ps: torch.Tensor  # float32 [bs]
    top_ks: torch.Tensor  # int32 [bs]
    min_ps: torch.Tensor  # float32 [bs]
    seeds: Optional[torch.Tensor]  # int64 [bs] (42 where a request has none); only with deterministic sampling
    penalties: Optional[torch.Tensor]  # float32 [bs, 3]: frequency, presence, repetition; None when no request has any
    is_all_greedy: bool  # every top_k <= 1
    need_top_p: bool  # some top_p != 1
    need_top_k: bool  # some top_k != TOP_K_ALL
    need_min_p: bool  # some min_p > 0

    @classmethod
    def from_staged(
        cls, tensors: Sequence[torch.Tensor], *, with_seeds: bool, with_penalties: bool, flags: Sequence[Any]
    ) -> "SamplingBatch":
        """tensors as staged in this order: temperatures ([bs] or [bs, 1]), top_ps, top_ks, min_ps,
        then seeds and penalties ([bs, 3]) when present; flags: (is_all_greedy, need_top_p,
        need_top_k, need_min_p). A view only where a shape differs: each is a dispatcher call,
        which costs microseconds in a scheduler step."""
        temperatures = tensors[0]
        return cls(
            temperatures=temperatures if temperatures.dim() == 2 else temperatures.view(-1, 1),
            top_ps=tensors[1],
            top_ks=tensors[2],
            min_ps=tensors[3],
            seeds=tensors[4] if with_seeds else None,
            penalties=tensors[-1] if with_penalties else None,
            is_all_greedy=bool(flags[0]),
            need_top_p=bool(flags[1]),
            need_top_k=bool(flags[2]),
            need_min_p=bool(flags[3]),
        )


def sampling_flags(top_p_min: float, top_k_min: int, top_k_max: int, min_p_max: float) -> Tuple[bool, bool, bool, bool]:
    """(is_all_greedy, need_top_p, need_top_k, need_min_p) of requests whose top_p, top_k and min_p
    lie within these bounds (one request: its own values as both bounds), as SGLang's
    from_schedule_batch sets them: every top_k <= 1; some top_p != 1 (top_p <= 1 is validated); some
    top_k != TOP_K_ALL; some min_p > 0."""
    return top_k_max <= 1, top_p_min < 1, top_k_min != TOP_K_ALL or top_k_max != TOP_K_ALL, min_p_max > 0


def build_sampling_batch(
    params: Sequence[SamplingFields],
    *,
    enable_deterministic_sampling: bool = False,
    stream: Optional[torch.cuda.Stream] = None,
    device: Device = None,
) -> SamplingBatch:
    """params: one sampling-parameters object per request, in batch order (pinstage's
    SamplingParams, SGLang's, or any SamplingFields: reads temperature, top_p, top_k, min_p,
    sampling_seed, frequency_penalty, presence_penalty, repetition_penalty, as SGLang's
    SamplingBatchInfo.from_schedule_batch and penalizers do) -> SamplingBatch, every tensor staged
    together (one copy).

    Raises ValueError (TypeError for a value of the wrong type) naming the request and the field
    when temperature is negative or not finite, top_p outside (0, 1], top_k not an int >= 1
    (TOP_K_ALL means all), min_p outside [0, 1], a penalty outside its range or sampling_seed neither
    an int nor None; TypeError naming what was expected when params is not a list or an entry lacks
    a field. Nothing is staged then.
    """
    fields, batch = sampling_fields(params, enable_deterministic_sampling)
    return batch(stage_fields(fields, stream, device))


def sampling_fields(
    params: Sequence[SamplingFields], enable_deterministic_sampling: bool = False
) -> Tuple[List[NamedValues], Callable[[Sequence[torch.Tensor]], SamplingBatch]]:
    """build_sampling_batch's host values, validated, as (name, one value per request, dtype)
    fields, and the function that makes the SamplingBatch of their tensors (staged in that order)."""
    params = checked_list("build_sampling_batch", params, "sampling parameters")
    try:
        temperatures = [p.temperature for p in params]
        top_ps = [p.top_p for p in params]
        top_ks = [p.top_k for p in params]
        min_ps = [p.min_p for p in params]
        penalties = [penalty_row(p) for p in params]
        seeds = [p.sampling_seed for p in params] if enable_deterministic_sampling else []
    except AttributeError:
        what = "sampling parameters (a request's .sampling_params)"
        raise missing_field("build_sampling_batch", params, SAMPLING_FIELDS, what) from None
    if params:
        _checked(temperatures, "temperature")
        top_p_min, _ = _checked(top_ps, "top_p")
        top_k_min, top_k_max = _checked(top_ks, "top_k")
        _, min_p_max = _checked(min_ps, "min_p")
        # By equality, not a set: a value that is not hashable (a list) must reach the check below.
        need_penalties = penalties.count(NO_PENALTIES) != len(penalties)
        if need_penalties:
            frequency, presence, repetition = zip(*penalties)
            _checked(frequency, "frequency_penalty")
            _checked(presence, "presence_penalty")
            _checked(repetition, "repetition_penalty")
        flags = sampling_flags(top_p_min, top_k_min, top_k_max, min_p_max)
    else:
        need_penalties = False
        flags = (True, False, False, False)

    fields: List[NamedValues] = [
        ("temperature", temperatures, torch.float32),
        ("top_p", top_ps, torch.float32),
        ("top_k", top_ks, torch.int32),
        ("min_p", min_ps, torch.float32),
    ]
    if enable_deterministic_sampling:
        seeds = [DEFAULT_SAMPLING_SEED if seed is None else seed for seed in seeds]
        if params:
            _checked(seeds, "sampling_seed")
        fields.append(("sampling_seed", seeds, torch.int64))
    if need_penalties:
        fields.append(("penalties", penalties, torch.float32))
    return fields, functools.partial(
        SamplingBatch.from_staged, with_seeds=enable_deterministic_sampling, with_penalties=need_penalties, flags=flags
    )


def _checked(values: Sequence[Any], name: str) -> Tuple[Any, Any]:
    integer, is_valid, expected = SAMPLING_RULES[name]
    return checked_bounds(values, name, is_valid, expected, integer)
