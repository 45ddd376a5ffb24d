"""The native gathers behind backend="pinstage": taken for plain request data, equal to the Python
gather that the other backends use, declining (None) whatever they would not convert exactly as it
does, and on the GPU one copy each, never reading ring memory that is reused, refused under capture."""
import enum
import random

import numpy as np
import pytest
import torch
from builders_support import (
    BATCH_SIZES, DEVICES, assert_fields_equal, assert_same_tensor, needs_cuda, random_requests,
)

import pinstage
from pinstage import _C
from pinstage.builders import (
    BACKENDS, DEFAULT_SAMPLING_SEED, TOP_K_ALL, Request, SamplingParams, build_decode_inputs,
    build_penalty_last_token_ids, build_sampling_batch,
)
from pinstage.builders.decode import decode_input_items, last_token_ids
from pinstage.builders.sampling import sampling_items


def random_params(rng, bs):
    # ints where floats are expected too: SamplingParams(temperature=1) is common in engine code.
    return [
        SamplingParams(
            temperature=rng.choice([0.0, 0.5, 1, 1.3, 2]),
            top_p=rng.choice([1.0, 1, 0.9, 0.3]),
            top_k=rng.choice([-1, 1, 20, TOP_K_ALL]),
            min_p=rng.choice([0.0, 0, 0.05, 1]),
            sampling_seed=rng.choice([None, rng.randrange(1 << 62)]),
        )
        for _ in range(bs)
    ]


def reference_tensors(values_and_dtypes):
    return [torch.tensor(np.asarray(v) if isinstance(v, np.ndarray) else v, dtype=d) for v, d in values_and_dtypes]


def assert_tensors_equal(actual, expected, device):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.device.type == device, (i, a.device)
        assert_same_tensor(a.cpu(), e, f"tensor {i}")


def finish(device):
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_decode_gather_equals_python_gather(rng, device, bs):
    requests = random_requests(rng, bs)
    staged = _C._stage_decode_inputs(requests, None, device)
    last_only = _C._stage_last_token_ids(requests, None, device)
    assert staged is not None and last_only is not None, "plain requests must take the native gather"
    finish(device)
    expected = reference_tensors(decode_input_items(requests))
    assert_tensors_equal(staged, expected, device)
    assert isinstance(last_only, torch.Tensor)
    assert_tensors_equal([last_only], expected[:1], device)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_sampling_gather_equals_python_gather(rng, device, bs, deterministic):
    params = random_params(rng, bs)
    staged = _C._stage_sampling_batch(params, deterministic, TOP_K_ALL, DEFAULT_SAMPLING_SEED, None, device)
    assert staged is not None, "plain sampling params must take the native gather"
    finish(device)
    tensors, *flags = staged
    items, expected_flags = sampling_items(params, deterministic)
    expected = reference_tensors(items)
    expected[0] = expected[0].view(-1, 1)
    assert_tensors_equal(tensors, expected, device)
    assert tuple(flags) == expected_flags


def test_sampling_flags_cover_each_case():
    def flags(**kw):
        staged = _C._stage_sampling_batch([SamplingParams(), SamplingParams(**kw)], False, TOP_K_ALL, 42, None, "cpu")
        return tuple(staged[1:])

    assert flags() == (False, False, False, False)
    assert flags(top_p=0.5) == (False, True, False, False)
    assert flags(top_k=5) == (False, False, True, False)
    assert flags(min_p=0.1) == (False, False, False, True)
    all_greedy = _C._stage_sampling_batch([SamplingParams(temperature=0.0)] * 2, False, TOP_K_ALL, 42, None, "cpu")
    assert tuple(all_greedy[1:]) == (True, False, True, False)


class PropertyRequest:
    """A request whose fields are properties, as engines' request classes often have."""

    def __init__(self, prompt, output, row):
        self._prompt, self._output, self._row = prompt, output, row

    origin_input_ids = property(lambda self: self._prompt)
    output_ids = property(lambda self: self._output)
    req_pool_idx = property(lambda self: self._row)


def test_fields_behind_properties_are_read():
    requests = [PropertyRequest([1, 2], [], 4), PropertyRequest((3,), (5, 6), 0)]
    staged = _C._stage_decode_inputs(requests, None, "cpu")
    assert [t.tolist() for t in staged] == [[2, 6], [2, 3], [4, 0]]


class ClassDefaultRow:
    """req_pool_idx from the class when the instance has none of its own."""

    req_pool_idx = 3

    def __init__(self, prompt, output):
        self.origin_input_ids, self.output_ids = prompt, output


class SlottedRequest:
    __slots__ = ("origin_input_ids", "output_ids", "req_pool_idx")

    def __init__(self, prompt, output, row):
        self.origin_input_ids, self.output_ids, self.req_pool_idx = prompt, output, row


class DynamicRequest:
    """Every field from __getattr__."""

    def __getattr__(self, name):
        return {"origin_input_ids": [4, 5], "output_ids": [6], "req_pool_idx": 9}[name]


def test_every_way_python_finds_a_field_is_followed():
    with_own_row = ClassDefaultRow([1], [2])
    with_own_row.req_pool_idx = 8  # the instance's value hides the class default
    requests = [
        Request([1, 2], [3], req_pool_idx=1),
        ClassDefaultRow([10, 11], []),
        with_own_row,
        SlottedRequest([7], [], 2),
        DynamicRequest(),
        PropertyRequest([12], [13, 14], 5),
        Request([15], [], req_pool_idx=6),  # the first class again, after five others
    ]
    staged = _C._stage_decode_inputs(requests, None, "cpu")
    assert staged is not None
    expected = reference_tensors(decode_input_items(requests))
    assert_tensors_equal(staged, expected, "cpu")
    assert staged[2].tolist() == [1, 3, 8, 2, 9, 5, 6]


class ClassDefaultPrompt:
    """origin_input_ids from the class: the gather finds it only after the output turned out empty."""

    origin_input_ids = [30, 31]

    def __init__(self, output):
        self.output_ids = output


def passes_taken(call):
    """(grouped, one_by_one): how many batches `call()` finished with each pass of the gather."""
    before = _C._last_token_pass_counts()
    call()
    after = _C._last_token_pass_counts()
    return after[0] - before[0], after[1] - before[1]


def test_plain_requests_take_the_grouped_pass():
    for bs in (1, 8, 9, 37):
        requests = random_requests(random.Random(bs), bs)
        got = []
        assert passes_taken(lambda: got.append(_C._stage_last_token_ids(requests, None, "cpu"))) == (1, 0)
        assert got[0].tolist() == last_token_ids(requests)


@pytest.mark.parametrize("odd_one_at", [0, 7, 8, 12, 19])
def test_last_token_ids_with_a_field_outside_the_instance_dict(odd_one_at):
    """The penalty gather reads plain requests in groups without running getters; one request whose
    field needs Python code (a property, a class default, __getattr__) anywhere in the batch sends the
    whole batch through the request-at-a-time pass, with the same result as Python. A prompt found
    only after an empty output sends it there from the grouped pass's last step."""
    odd_ones = [PropertyRequest([12], [13, 14], 5), PropertyRequest([15], [], 0), DynamicRequest(),
                ClassDefaultPrompt([]), PropertyRequest([16, 17], [], 3)]
    for odd in odd_ones:
        requests = [Request([i, i + 100], [i + 200] * (i % 3), req_pool_idx=i) for i in range(20)]
        requests[odd_one_at] = odd
        got = []
        assert passes_taken(lambda: got.append(_C._stage_last_token_ids(requests, None, "cpu"))) == (0, 1)
        assert got[0].tolist() == last_token_ids(requests)
    # A class-default prompt behind a non-empty output is never read: the grouped pass finishes.
    requests = [Request([1], [2]) for _ in range(11)] + [ClassDefaultPrompt([40])]
    got = []
    assert passes_taken(lambda: got.append(_C._stage_last_token_ids(requests, None, "cpu"))) == (1, 0)
    assert got[0].tolist() == [2] * 11 + [40]


class Color(enum.IntEnum):
    RED = 7


@pytest.mark.parametrize("token", [-1, 2**30 - 1, 2**30, -(2**30), -(2**30) - 1, 2**62, 2**63 - 1, -(2**63),
                                   2**63, -(2**63) - 1, 2**100, True, False, 1.7, -2.5, Color.RED, None, "7"])
@pytest.mark.parametrize("where", ["output", "prompt"])
def test_last_token_values_at_the_edges_match_torch(token, where):
    """Ints on both sides of CPython's compact range and of int64, and tokens of other types: every
    backend gives torch.tensor's value, or every backend raises the same exception type."""
    requests = [Request([1, 2], [3]) for _ in range(9)]
    requests[4] = Request([5, token], []) if where == "prompt" else Request([5], [6, token])
    outcomes = {}
    for backend in BACKENDS:
        try:
            outcomes[backend] = build_penalty_last_token_ids(requests, backend=backend, device="cpu").tolist()
        except Exception as e:  # noqa: BLE001 (the type is what is compared)
            outcomes[backend] = type(e)
    assert len(set(map(repr, outcomes.values()))) == 1, outcomes
    try:
        expected = torch.tensor(last_token_ids(requests), dtype=torch.int64).tolist()
    except Exception as e:  # noqa: BLE001
        expected = type(e)
    assert outcomes["pinstage"] == expected


def test_rows_beyond_the_compact_range_are_staged():
    requests = [Request([1], [2], req_pool_idx=2**40), Request([3], [], req_pool_idx=2**30)]
    staged = _C._stage_decode_inputs(requests, None, "cpu")
    assert staged is not None and staged[2].tolist() == [2**40, 2**30]


def test_entry_points_name_themselves_in_argument_errors():
    with pytest.raises(TypeError, match="_stage_last_token_ids"):
        _C._stage_last_token_ids([])
    with pytest.raises(TypeError, match="_stage_sampling_batch"):
        _C._stage_sampling_batch([], False)


def test_last_token_ids_getters_run_in_python_order():
    """Getters that see each other's effects: the native gather calls them in the order Python does."""
    calls = []

    class Logged(PropertyRequest):
        @property
        def output_ids(self):
            calls.append(("output", self._row))
            return self._output

        @property
        def origin_input_ids(self):
            calls.append(("prompt", self._row))
            return self._prompt

    requests = [Logged([1, 2], [] if i % 2 else [3], i) for i in range(11)]
    staged = _C._stage_last_token_ids(requests, None, "cpu")
    native_calls, calls[:] = list(calls), []
    assert staged.tolist() == last_token_ids(requests)
    assert native_calls == calls
    assert ("prompt", 1) in calls and ("prompt", 0) not in calls


def test_a_getter_that_empties_the_batch_makes_the_gather_decline():
    requests = []

    class Shrinking(PropertyRequest):
        @property
        def output_ids(self):
            requests.clear()  # the list the gather walks loses this very request
            return [7]

    requests.extend([Shrinking([1], [], 0), Shrinking([2], [], 1)])
    assert _C._stage_decode_inputs(requests, None, "cpu") is None


def test_list_subclasses_are_declined():
    """A subclass's __iter__ or __getitem__ may disagree with a direct read of its items."""

    class Reversed(list):
        def __iter__(self):
            return reversed(list(self.__getitem__(slice(None))))

    requests = Reversed([Request([1], [], req_pool_idx=0), Request([2], [], req_pool_idx=1)])
    assert _C._stage_last_token_ids(requests, None, "cpu") is None
    assert build_penalty_last_token_ids(requests, device="cpu").tolist() == [2, 1]
    tokens = Reversed([5, 6])
    assert _C._stage_last_token_ids([Request([1], tokens)], None, "cpu") is None


def test_a_class_changed_by_a_getter_is_looked_up_again():
    """The second request's temperature getter turns top_p into a property. The gather reads
    request by request, so the first request's top_p came from its dict and the second's must come
    from the new property; a class lookup kept from the first request would read 0.5 twice."""

    class Changing(SamplingParams):
        trigger = None

        @property
        def temperature(self):
            if self is type(self).trigger:
                type(self).top_p = property(lambda _: 0.25)
            return 0.5

        @temperature.setter
        def temperature(self, value):
            pass

    params = [Changing(top_p=0.5), Changing(top_p=0.5)]
    Changing.trigger = params[1]
    staged = _C._stage_sampling_batch(params, False, TOP_K_ALL, 42, None, "cpu")
    assert staged is not None
    assert staged[0][1].tolist() == [0.5, 0.25]


DECLINED_REQUESTS = {
    "numpy row": lambda: [Request([1, 2], [3], req_pool_idx=np.int64(5))],
    "bool row": lambda: [Request([1, 2], [3], req_pool_idx=True)],
    "numpy token": lambda: [Request([1, np.int64(2)], [], req_pool_idx=0)],
}


@pytest.mark.parametrize("case", sorted(DECLINED_REQUESTS))
@pytest.mark.parametrize("device", DEVICES)
def test_declined_requests_still_stage_what_python_gives(case, device):
    requests = DECLINED_REQUESTS[case]()
    assert _C._stage_decode_inputs(requests, None, device) is None
    got = build_decode_inputs(requests, device=device)
    want = build_decode_inputs(requests, backend="blocking", device=device)
    assert_fields_equal(got, want)
    if case == "numpy token":
        assert_same_tensor(build_penalty_last_token_ids(requests, device=device).cpu(), torch.tensor([2]))


DECLINED_PARAMS = {
    "bool temperature": dict(temperature=True),
    "numpy top_k": dict(top_k=np.int32(5)),
    "int beyond 2**53 as temperature": dict(temperature=2**60),
    "numpy seed": dict(sampling_seed=np.int64(7)),
}


@pytest.mark.parametrize("case", sorted(DECLINED_PARAMS))
@pytest.mark.parametrize("device", DEVICES)
def test_declined_params_still_stage_what_python_gives(case, device):
    params = [SamplingParams(), SamplingParams(**DECLINED_PARAMS[case])]
    assert _C._stage_sampling_batch(params, True, TOP_K_ALL, 42, None, device) is None
    got = build_sampling_batch(params, enable_deterministic_sampling=True, device=device)
    want = build_sampling_batch(params, enable_deterministic_sampling=True, backend="blocking", device=device)
    assert_fields_equal(got, want)


@pytest.mark.parametrize(
    "field, bad",
    [("temperature", -0.5), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", 0),
     ("min_p", -0.1), ("min_p", 2), ("top_k", "5"), ("temperature", None)],
)
def test_invalid_params_make_the_gather_decline(field, bad):
    p = SamplingParams()
    setattr(p, field, bad)  # after __post_init__, as a mutated or duck-typed object would arrive
    assert _C._stage_sampling_batch([SamplingParams(), p], False, TOP_K_ALL, 42, None, "cpu") is None
    with pytest.raises((ValueError, TypeError), match=f"request 1: {field}"):
        build_sampling_batch([SamplingParams(), p], device="cpu")


# ---------------------------------------------------------------------------------------------
# On the GPU

NATIVE_CALLS = {
    "decode": lambda rng: _C._stage_decode_inputs(random_requests(rng, 64), None, None),
    "penalty": lambda rng: [_C._stage_last_token_ids(random_requests(rng, 64), None, None)],
    # (tensors, flags...): the tensors
    "sampling": lambda rng: _C._stage_sampling_batch(random_params(rng, 64), True, TOP_K_ALL, 42, None, None)[0],
}


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(NATIVE_CALLS))
def test_each_native_gather_is_one_copy(rng, name):
    NATIVE_CALLS[name](rng)
    torch.cuda.synchronize()
    before = pinstage.stats()
    with pinstage.testing.no_sync():
        tensors = NATIVE_CALLS[name](rng)
    after = pinstage.stats()
    assert after["copies"] - before["copies"] == 1
    assert after["calls"] - before["calls"] == 1
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1, "results are views of one allocation"


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(NATIVE_CALLS))
def test_native_gathers_refuse_a_capturing_stream(rng, name):
    NATIVE_CALLS[name](rng)  # warm: nothing lazy left to initialise inside the capture
    capture_stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    static = torch.zeros(4, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=capture_stream):
        static += 1
        with pytest.raises(RuntimeError, match="(?i)captur"):
            NATIVE_CALLS[name](rng)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("on_full", ["overflow", "wait"])
def test_native_gathers_never_reuse_ring_memory_still_being_copied(rng, on_full):
    """A 4 KiB ring, the stream asleep, and many builder calls with different values: if any region
    were handed out while its copy was still queued, a later call's values would show up in an
    earlier call's result."""
    from builders_support import BUSY_CYCLES

    stats = pinstage.stats()
    pinstage.configure(ring_bytes=4096, on_full=on_full)
    try:
        batches = [random_requests(rng, rng.randint(1, 48)) for _ in range(120)]
        params = [random_params(rng, rng.randint(1, 24)) for _ in range(120)]
        torch.cuda.synchronize()
        torch.cuda._sleep(BUSY_CYCLES)
        decode = [build_decode_inputs(b) for b in batches]
        sampling = [build_sampling_batch(p, enable_deterministic_sampling=True) for p in params]
        torch.cuda.synchronize()
        for b, got in zip(batches, decode):
            assert_fields_equal(got, build_decode_inputs(b, backend="blocking"))
        for p, got in zip(params, sampling):
            assert_fields_equal(got, build_sampling_batch(p, enable_deterministic_sampling=True, backend="blocking"))
    finally:
        torch.cuda.synchronize()
        pinstage.configure(ring_bytes=stats["ring_bytes"], on_full=stats["on_full"])
