"""Objects shaped like SGLang 0.5.23's (its Req keeps the row in a ReqKvInfo, output_ids an array("q")),
used as the builders' protocols allow: mypy (.ci/run) finds no error."""

from array import array
from typing import List, Optional

import torch

from pinstage.builders import BatchState, SamplingBatch, build_decode_inputs, build_sampling_batch


class ReqKvInfo:
    req_pool_idx: Optional[int] = None


class EngineSamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 1 << 30
    min_p: float = 0.0
    sampling_seed: Optional[int] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 16


class Req:
    def __init__(self, origin_input_ids: List[int]) -> None:
        self.origin_input_ids = origin_input_ids
        self.output_ids = array("q")
        self.kv = ReqKvInfo()
        self.sampling_params = EngineSamplingParams()


reqs = [Req([1, 2]), Req([3])]
ids: torch.Tensor = build_decode_inputs(reqs).input_ids
batch: SamplingBatch = build_sampling_batch([r.sampling_params for r in reqs])
state = BatchState()
slot: int = state.add(reqs[0])
