import math

import pytest
import torch
from staging_reference import assert_same_tensor
from support import (
    BATCH_SIZES,
    DEVICES,
    assert_fields_equal,
    random_params,
    reference_sampling_batch,
    run_while_stream_busy,
)

from pinstage.builders import DEFAULT_SAMPLING_SEED, TOP_K_ALL, SamplingParams, build_sampling_batch


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_sampling_batch_equal_torch_tensor_and_reference(rng, device, bs, deterministic):
    params = random_params(rng, bs)
    got = build_sampling_batch(params, enable_deterministic_sampling=deterministic, device=device)
    assert_fields_equal(got, reference_sampling_batch(params, device, deterministic))  # on the same device
    assert got.temperatures.device.type == device
    assert_same_tensor(
        got.temperatures.cpu(), torch.tensor([[p.temperature] for p in params], dtype=torch.float32).view(-1, 1)
    )
    assert_same_tensor(got.top_ps.cpu(), torch.tensor([p.top_p for p in params], dtype=torch.float32))
    assert_same_tensor(got.top_ks.cpu(), torch.tensor([p.top_k for p in params], dtype=torch.int32))
    assert_same_tensor(got.min_ps.cpu(), torch.tensor([p.min_p for p in params], dtype=torch.float32))
    if deterministic:
        seeds = [DEFAULT_SAMPLING_SEED if p.sampling_seed is None else p.sampling_seed for p in params]
        assert_same_tensor(got.seeds.cpu(), torch.tensor(seeds, dtype=torch.int64))
    else:
        assert got.seeds is None
    assert got.is_all_greedy == all(p.top_k <= 1 for p in params)
    assert got.need_top_p == any(p.top_p != 1.0 for p in params)
    assert got.need_top_k == any(p.top_k != TOP_K_ALL for p in params)
    assert got.need_min_p == any(p.min_p > 0 for p in params)
    penalties = [(p.frequency_penalty, p.presence_penalty, p.repetition_penalty) for p in params]
    if any(row != (0.0, 0.0, 1.0) for row in penalties):
        assert_same_tensor(got.penalties.cpu(), torch.tensor(penalties, dtype=torch.float32))
    else:
        assert got.penalties is None


def test_flags_follow_the_parameters():
    greedy = build_sampling_batch([SamplingParams(temperature=0.0), SamplingParams(top_k=1)], device="cpu")
    assert greedy.is_all_greedy and greedy.need_top_k and not greedy.need_top_p and not greedy.need_min_p
    plain = build_sampling_batch([SamplingParams(), SamplingParams(top_k=-1)], device="cpu")
    assert not plain.is_all_greedy and not plain.need_top_k and not plain.need_top_p and not plain.need_min_p
    mixed = build_sampling_batch([SamplingParams(top_p=0.9), SamplingParams(min_p=0.1)], device="cpu")
    assert mixed.need_top_p and mixed.need_min_p and not mixed.need_top_k
    empty = build_sampling_batch([], device="cpu")
    assert empty.is_all_greedy and not (empty.need_top_p or empty.need_top_k or empty.need_min_p)
    assert empty.temperatures.shape == (0, 1) and empty.top_ks.dtype == torch.int32


def test_zero_temperature_becomes_greedy_top_k():
    p = SamplingParams(temperature=0.0, top_k=50)
    assert (p.temperature, p.top_k) == (1.0, 1)
    assert SamplingParams(top_k=-1).top_k == TOP_K_ALL


@pytest.mark.parametrize(
    "field, bad, error",
    [
        ("temperature", -0.5, ValueError),
        ("temperature", math.nan, ValueError),
        ("top_p", 0.0, ValueError),
        ("top_p", 1.5, ValueError),
        ("top_p", math.nan, ValueError),
        ("top_k", 0, ValueError),
        ("top_k", -7, ValueError),
        ("min_p", -0.1, ValueError),
        ("min_p", 1.01, ValueError),
        ("min_p", math.nan, ValueError),
        ("temperature", None, TypeError),
        ("top_k", "5", TypeError),
    ],
)
@pytest.mark.parametrize("position", [0, 2])  # NaN is only invisible to min/max when it is not first
def test_invalid_parameter_names_request_and_field(field, bad, error, position):
    params = [SamplingParams(top_p=0.9, min_p=0.01) for _ in range(4)]
    setattr(params[position], field, bad)
    with pytest.raises(error, match=rf"request {position}: {field} must be"):
        build_sampling_batch(params, device="cpu")


NON_FINITE_FIELDS = ["temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("field", NON_FINITE_FIELDS)
def test_non_finite_values_are_refused_everywhere(field, bad):
    """As SGLang's SamplingParams.verify refuses them: at construction, per batch (a field changed
    afterwards) and by BatchState.add."""
    from pinstage.builders import BatchState, Request

    with pytest.raises(ValueError, match=rf"SamplingParams: {field} must be"):
        SamplingParams(**{field: bad})
    params = [SamplingParams(), SamplingParams(), SamplingParams(frequency_penalty=0.5)]
    setattr(params[1], field, bad)
    with pytest.raises(ValueError, match=rf"request 1: {field} must be .*, got {bad}$"):
        build_sampling_batch(params, device="cpu")
    state = BatchState()
    with pytest.raises(ValueError, match=rf"BatchState.add: sampling_params: {field} must be .*, got {bad}$"):
        state.add(Request([1], sampling_params=params[1]))
    assert len(state) == 0


def test_values_that_params_accept_are_accepted_per_batch():
    """Whatever SamplingParams accepts (subclasses of int and float: numpy float64, IntEnum), the
    batch check accepts too, with the values torch.tensor gives."""
    import enum

    import numpy as np

    class TopK(enum.IntEnum):
        FIVE = 5

    params = [SamplingParams(top_p=np.float64(0.9), top_k=TopK.FIVE, min_p=np.float64(0.1)), SamplingParams()]
    batch = build_sampling_batch(params, device="cpu")
    assert_same_tensor(batch.top_ps, torch.tensor([0.9, 1.0], dtype=torch.float32))
    assert_same_tensor(batch.top_ks, torch.tensor([5, TOP_K_ALL], dtype=torch.int32))
    assert batch.need_top_p and batch.need_top_k and batch.need_min_p


@pytest.mark.cuda
def test_sampling_builder_does_not_wait_for_a_busy_stream(rng):
    params = random_params(rng, 256)
    stream = torch.cuda.Stream()
    build = lambda: build_sampling_batch(params, enable_deterministic_sampling=True, stream=stream)  # noqa: E731
    build()
    result, still_busy = run_while_stream_busy(build, stream)
    assert still_busy, "the builder returned only after the busy stream finished"
    torch.cuda.synchronize()
    assert_fields_equal(result, reference_sampling_batch(params, "cuda", enable_deterministic_sampling=True))


@pytest.mark.parametrize("bad", [1.0, True])
@pytest.mark.parametrize("position", [0, 1])
def test_a_top_k_of_another_type_equal_to_an_int_is_named_wherever_it_stands(bad, position):
    """1.0 and True equal 1: the batch check must look at each request's type, not the set's."""
    params = [SamplingParams(top_k=1), SamplingParams(top_k=1)]
    params[position].top_k = bad
    with pytest.raises(TypeError, match=rf"request {position}: top_k must be an int, got {type(bad).__name__}"):
        build_sampling_batch(params, device="cpu")


def test_an_unhashable_penalty_is_named():
    params = [SamplingParams(), SamplingParams()]
    params[1].repetition_penalty = [1.0]
    with pytest.raises(TypeError, match=r"request 1: repetition_penalty must be a real number, got list \[1.0\]"):
        build_sampling_batch(params, device="cpu")


@pytest.mark.parametrize("position", [0, 1])
def test_a_temperature_beyond_float_is_named_beside_a_float(position):
    """As for one request alone: an OverflowError naming the request, not one from the batch check."""
    from pinstage.builders import BatchState, Request

    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.5)]
    params[position].temperature = 10**400
    with pytest.raises(OverflowError, match=rf"^request {position}: temperature = 1000.* cannot be converted"):
        build_sampling_batch(params, device="cpu")
    state = BatchState()
    state.add(Request([1]))
    with pytest.raises(
        OverflowError, match=r"^BatchState.add: sampling_params.temperature = 1000.* cannot be converted"
    ):
        state.add(Request([2], sampling_params=params[position]))
    assert len(state) == 1 and state.sampling_batch(device="cpu").temperatures.tolist() == [[1.0]]
