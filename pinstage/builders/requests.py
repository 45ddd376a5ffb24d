"""The plain request data the builders read: no engine framework, just what a scheduler holds."""
from dataclasses import dataclass, field
from typing import List, Optional

# top_k of every token. Requests ask for it with -1, which SamplingParams stores as this value so
# that the per-step builder compares ints instead of rewriting the list every step.
TOP_K_ALL = 1 << 30

# Below this a temperature means greedy decoding (as in SGLang's sampling parameters).
_GREEDY_TEMPERATURE = 1e-6


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    sampling_seed: Optional[int] = None

    def __post_init__(self):
        if self.top_k == -1:
            self.top_k = TOP_K_ALL
        # A near-zero temperature is greedy decoding; expressing it as top_k=1 at temperature 1 keeps
        # the sampler from dividing by ~0 and lets the batch take the all-greedy fast path.
        if 0 <= self.temperature < _GREEDY_TEMPERATURE:
            self.temperature = 1.0
            self.top_k = 1


@dataclass
class Request:
    origin_input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    req_pool_idx: int = 0
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
