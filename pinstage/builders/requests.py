"""The plain request data the builders read: what a scheduler holds per request, no framework."""

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ._checks import is_int, is_real
from ._fields import lacks_field

# top_k of every token. Requests ask for it with -1, which SamplingParams stores as this value so
# that the per-step builder compares ints instead of rewriting the list every step (SGLang's value).
TOP_K_ALL = 1 << 30

# Below this a temperature means greedy decoding (as in SGLang's sampling parameters).
_GREEDY_TEMPERATURE = 1e-6


# field -> (integer, is_valid, expected), as SGLang's SamplingParams.verify states them. SamplingParams
# checks them at construction, and the builders again per batch, as a field may be changed afterwards.
SAMPLING_RULES: Dict[str, Tuple[bool, Callable[[float], bool], str]] = {
    "temperature": (False, lambda v: 0 <= v < math.inf, "a finite number >= 0"),
    "top_p": (False, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (True, lambda v: v >= 1, f">= 1 (TOP_K_ALL = {TOP_K_ALL} for all tokens; -1 at construction)"),
    "min_p": (False, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "sampling_seed": (True, lambda v: -(2**63) <= v < 2**63, "an int64 or None"),
    "frequency_penalty": (False, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "presence_penalty": (False, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "repetition_penalty": (False, lambda v: 0 < v <= 2, "in (0, 2]"),
}
SAMPLING_FIELDS = tuple(SAMPLING_RULES)  # what the builders read of a sampling-parameters object


@dataclass
class SamplingParams:
    """One request's sampling settings, validated at construction (TypeError for a value of the
    wrong type, ValueError for one out of range; both name the field).

    temperature finite and >= 0 (below 1e-6: greedy, stored as temperature 1 with top_k 1); top_p in (0, 1];
    top_k >= 1, or -1 for all tokens (stored as TOP_K_ALL); min_p in [0, 1]; sampling_seed an int
    or None; frequency_penalty and presence_penalty in [-2, 2]; repetition_penalty in (0, 2].
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    sampling_seed: Optional[int] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if is_int(self.top_k) and self.top_k == -1:
            self.top_k = TOP_K_ALL
        check_sampling_fields(self, "SamplingParams")
        # A near-zero temperature is greedy decoding; expressing it as top_k=1 at temperature 1 keeps
        # the sampler from dividing by ~0 and lets the batch take the all-greedy fast path.
        if self.temperature < _GREEDY_TEMPERATURE:
            self.temperature = 1.0
            self.top_k = 1


def check_sampling_fields(params: object, where: str) -> None:
    """Raise TypeError / ValueError naming the first of SAMPLING_RULES' fields of `params` (any
    object with them: SamplingFields) that is not valid; TypeError if it lacks one."""
    missing = lacks_field(where, params, SAMPLING_FIELDS, "sampling parameters")
    if missing is not None:
        raise missing
    for name, (integer, is_valid, expected) in SAMPLING_RULES.items():
        value = getattr(params, name)
        if value is None and name == "sampling_seed":
            continue
        if not (is_int if integer else is_real)(value):
            kind = "an int" if integer else "a real number"
            raise TypeError(f"{where}: {name} must be {kind}, got {type(value).__name__} {value!r}")
        if not is_valid(value):
            raise ValueError(f"{where}: {name} must be {expected}, got {value!r}")


NO_PENALTIES = (0.0, 0.0, 1.0)


@dataclass
class Request:
    """What the builders read of a request: its prompt, the tokens generated so far, its row in
    req_to_token and its sampling settings."""

    origin_input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    req_pool_idx: int = 0
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
