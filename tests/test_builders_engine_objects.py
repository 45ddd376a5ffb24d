"""The builders and BatchState.add on objects shaped like SGLang 0.5.23's Req and SamplingParams
(sglang/srt/managers/schedule_batch.py, sglang/srt/sampling/sampling_params.py): the row at
req.kv.req_pool_idx, output_ids an array("q"), slotted classes, no .penalties and no .validate().
They must give exactly what pinstage's own Request and SamplingParams give for the same values."""

import math
from array import array
from typing import List, Optional

import pytest
import torch
from staging_reference import assert_same_tensor
from support import DEVICES, assert_fields_equal, random_params, random_requests

from pinstage.builders import (
    TOP_K_ALL,
    BatchState,
    Request,
    SamplingParams,
    build_decode_inputs,
    build_penalty_last_token_ids,
    build_sampling_batch,
)
from pinstage.builders.requests import SAMPLING_FIELDS  # the fields a builder reads: the stand-in copies them


class EngineKvInfo:
    """SGLang 0.5.23's ReqKvInfo (a slotted dataclass): the request's req_to_token row, None while
    it holds none."""

    __slots__ = ("req_pool_idx", "kv_committed_len")

    def __init__(self, req_pool_idx: Optional[int] = None):
        self.req_pool_idx = req_pool_idx
        self.kv_committed_len = 0


class EngineSamplingParams:
    """SGLang's SamplingParams: the sampling fields plus others the builders must not need; slotted
    (SGLang's is a msgspec.Struct), so nothing can be read that it does not define."""

    __slots__ = SAMPLING_FIELDS + ("max_new_tokens", "stop_strs", "logit_bias")

    def __init__(self, params: SamplingParams):
        for name in SAMPLING_FIELDS:
            setattr(self, name, getattr(params, name))
        self.max_new_tokens, self.stop_strs, self.logit_bias = 128, [], None


class EngineReq:
    """SGLang 0.5.23's Req as far as the builders go: a list prompt, an array("q") of outputs, its
    row in `kv`, and other state."""

    __slots__ = ("rid", "origin_input_ids", "output_ids", "kv", "sampling_params", "finished_reason")

    def __init__(self, request: Request):
        self.rid = object()
        self.origin_input_ids: List[int] = list(request.origin_input_ids)
        self.output_ids = array("q", request.output_ids)
        self.kv = EngineKvInfo(req_pool_idx=request.req_pool_idx)
        self.sampling_params = EngineSamplingParams(request.sampling_params)
        self.finished_reason = None


def engine_batch(rng, bs):
    requests = random_requests(rng, bs)
    for request, params in zip(requests, random_params(rng, bs)):
        request.sampling_params = params
    return requests, [EngineReq(r) for r in requests]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", [0, 1, 300])
def test_list_builders_read_engine_objects(rng, device, bs):
    requests, reqs = engine_batch(rng, bs)
    assert_fields_equal(build_decode_inputs(reqs, device=device), build_decode_inputs(requests, device=device))
    assert_same_tensor(
        build_penalty_last_token_ids(reqs, device=device), build_penalty_last_token_ids(requests, device=device)
    )
    for deterministic in (False, True):
        got = build_sampling_batch(
            [r.sampling_params for r in reqs], enable_deterministic_sampling=deterministic, device=device
        )
        want = build_sampling_batch(
            [r.sampling_params for r in requests], enable_deterministic_sampling=deterministic, device=device
        )
        assert_fields_equal(got, want)
    rows = torch.tensor([r.req_pool_idx for r in requests], dtype=torch.int64)
    assert_same_tensor(build_decode_inputs(reqs, device=device).req_pool_indices.cpu(), rows)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_state_adds_engine_objects(rng, device):
    requests, reqs = engine_batch(rng, 64)
    state = BatchState(capacity=4)
    for req in reqs:
        state.add(req)
    state.remove(list(range(0, 64, 3)))
    kept = [r for i, r in enumerate(requests) if i % 3]
    assert_fields_equal(state.decode_inputs(device=device), build_decode_inputs(kept, device=device))
    got = state.sampling_batch(enable_deterministic_sampling=True, device=device)
    want = build_sampling_batch([r.sampling_params for r in kept], enable_deterministic_sampling=True, device=device)
    assert_fields_equal(got, want)


def test_penalties_are_read_from_the_three_fields():
    params = EngineSamplingParams(SamplingParams(frequency_penalty=0.5, presence_penalty=-0.25, repetition_penalty=1.5))
    batch = build_sampling_batch([params, EngineSamplingParams(SamplingParams())], device="cpu")
    assert_same_tensor(batch.penalties, torch.tensor([[0.5, -0.25, 1.5], [0.0, 0.0, 1.0]], dtype=torch.float32))
    state = BatchState()
    state.add(EngineReq(Request([1], sampling_params=SamplingParams(presence_penalty=0.75))))
    assert state.need_penalties
    assert_same_tensor(
        state.sampling_batch(device="cpu").penalties, torch.tensor([[0.0, 0.75, 1.0]], dtype=torch.float32)
    )


def test_engine_params_are_validated_as_pinstage_params_are():
    """Without a .validate() on the caller's object, the builders check the fields themselves."""
    params = EngineSamplingParams(SamplingParams())
    params.top_p = 1.5
    with pytest.raises(ValueError, match=r"BatchState.add: sampling_params: top_p must be in \(0, 1\], got 1.5"):
        BatchState().add(_req_with(params))
    with pytest.raises(ValueError, match=r"request 0: top_p must be in \(0, 1\]"):
        build_sampling_batch([params], device="cpu")


def _req_with(params):
    req = EngineReq(Request([1]))
    req.sampling_params = params
    return req


def test_a_request_without_a_row_is_refused_naming_it():
    reqs = [EngineReq(Request([1], req_pool_idx=0)), EngineReq(Request([2], req_pool_idx=1))]
    reqs[1].kv.req_pool_idx = None  # SGLang's "holds no KV"
    with pytest.raises(TypeError, match=r"request 1: req_pool_idx must be an int, got NoneType"):
        build_decode_inputs(reqs, device="cpu")
    state = BatchState()
    with pytest.raises(TypeError, match=r"BatchState.add: req_pool_idx must be an int, got NoneType"):
        state.add(reqs[1])
    assert len(state) == 0


def test_row_on_the_request_is_preferred_to_the_kv_record():
    """An object with both (a transition between versions) is read at req.req_pool_idx."""
    req = EngineReq(Request([1], req_pool_idx=5))
    both = type(
        "Both",
        (),
        {
            "origin_input_ids": [1],
            "output_ids": [],
            "req_pool_idx": 7,
            "kv": req.kv,
            "sampling_params": req.sampling_params,
        },
    )()
    assert build_decode_inputs([both], device="cpu").req_pool_indices.tolist() == [7]


def test_mixed_request_shapes_in_one_batch():
    reqs = [Request([1], req_pool_idx=3), EngineReq(Request([2], req_pool_idx=4))]
    assert build_decode_inputs(reqs, device="cpu").req_pool_indices.tolist() == [3, 4]


def test_sampling_fields_are_not_required_to_be_pinstage_types():
    """top_k as SGLang stores "all tokens" (TOP_K_ALL) and a greedy request as its __post_init__
    leaves it (temperature 1, top_k 1)."""
    greedy = EngineSamplingParams(SamplingParams())
    greedy.top_k = 1
    batch = build_sampling_batch([greedy, EngineSamplingParams(SamplingParams())], device="cpu")
    assert_same_tensor(batch.top_ks, torch.tensor([1, TOP_K_ALL], dtype=torch.int32))
    assert batch.need_top_k and not batch.is_all_greedy


def test_non_finite_temperature_of_engine_params_is_refused():
    params = EngineSamplingParams(SamplingParams())
    params.temperature = math.inf
    with pytest.raises(ValueError, match=r"request 0: temperature must be a finite number >= 0, got inf"):
        build_sampling_batch([params], device="cpu")
