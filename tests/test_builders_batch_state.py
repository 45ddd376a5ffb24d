"""BatchState: its per-step builders give the tensors the list-of-requests builders give for the
same requests, through any sequence of add / remove / filter / merge / append_tokens."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from staging_reference import assert_same_tensor
from support import (
    DEVICES,
    assert_fields_equal,
    random_params,
    reference_decode_inputs,
    reference_last_token_ids,
    reference_sampling_batch,
    run_while_stream_busy,
)

import pinstage
from pinstage.builders import (
    BatchState,
    Request,
    SamplingParams,
    build_decode_inputs,
    build_penalty_last_token_ids,
    build_sampling_batch,
    sampling_fields,
)


def random_request(rng, row):
    prompt = [rng.randrange(1 << 17) for _ in range(rng.randint(1, 5))]
    output = [rng.randrange(1 << 17) for _ in range(rng.choice([0, 0, 1, 4]))]
    return Request(prompt, output, req_pool_idx=row, sampling_params=random_params(rng, 1)[0])


def assert_state_matches_requests(state, requests, device="cpu"):
    """Every per-step builder of the state equals the list builder on `requests` (the model)."""
    assert len(state) == len(requests)
    assert_fields_equal(state.decode_inputs(device=device), build_decode_inputs(requests, device=device))
    assert_same_tensor(
        state.penalty_last_token_ids(device=device), build_penalty_last_token_ids(requests, device=device)
    )
    params = [r.sampling_params for r in requests]
    for deterministic in (False, True):
        got = state.sampling_batch(enable_deterministic_sampling=deterministic, device=device)
        want = build_sampling_batch(params, enable_deterministic_sampling=deterministic, device=device)
        assert_fields_equal(got, want)
        # The same values for a caller's own stage_many (a prefill's), in the list builder's order.
        fields, make_batch = state.sampling_fields(deterministic)
        assert [name for name, _, _ in fields] == [name for name, _, _ in sampling_fields(params, deterministic)[0]]
        staged = pinstage.stage_many([(values, dtype) for _, values, dtype in fields], device=device)
        assert_fields_equal(make_batch(staged), want)


class BatchStateMachine(RuleBasedStateMachine):
    """A BatchState next to the list of Request objects it stands for; after every step the two
    must give equal tensors."""

    @initialize(data=st.data())
    def start(self, data):
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        self.state = BatchState(capacity=data.draw(st.integers(1, 8)))
        self.requests = []
        self.next_row = 0

    def new_request(self, data):
        prompt = data.draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=4))
        output = data.draw(st.lists(st.integers(0, 2**40), max_size=3))
        params = SamplingParams(
            temperature=data.draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])),
            top_p=data.draw(st.sampled_from([1.0, 0.9, 0.3])),
            top_k=data.draw(st.sampled_from([-1, 1, 5, 40])),
            min_p=data.draw(st.sampled_from([0.0, 0.05, 1e-50])),
            sampling_seed=data.draw(st.sampled_from([None, 7, 2**62])),
            frequency_penalty=data.draw(st.sampled_from([0.0, 0.0, 0.5, -1.0])),
            presence_penalty=data.draw(st.sampled_from([0.0, 0.0, 0.25])),
            repetition_penalty=data.draw(st.sampled_from([1.0, 1.0, 1.2, 0.8])),
        )
        self.next_row += 1
        return Request(prompt, output, req_pool_idx=self.next_row, sampling_params=params)

    @rule(data=st.data(), count=st.integers(1, 4))
    def add(self, data, count):
        for _ in range(count):
            request = self.new_request(data)
            assert self.state.add(request) == len(self.requests)
            self.requests.append(request)

    @rule(data=st.data())
    def remove(self, data):
        if not self.requests:
            return
        slots = data.draw(st.sets(st.integers(0, len(self.requests) - 1), max_size=len(self.requests)))
        self.state.remove(sorted(slots))
        self.requests = [r for i, r in enumerate(self.requests) if i not in slots]

    @rule(data=st.data())
    def filter_reordered(self, data):
        if not self.requests:
            return
        keep = data.draw(st.permutations(range(len(self.requests))))
        keep = keep[: data.draw(st.integers(0, len(keep)))]
        self.state.filter(keep)
        self.requests = [self.requests[i] for i in keep]

    @rule(data=st.data(), count=st.integers(0, 3))
    def merge(self, data, count):
        other = BatchState(capacity=1)
        for _ in range(count):
            request = self.new_request(data)
            other.add(request)
            self.requests.append(request)
        self.state.merge(other)

    @rule(as_tensor=st.booleans())
    def append_tokens(self, as_tensor):
        tokens = self.rng.integers(0, 1 << 20, len(self.requests), dtype=np.int64)
        self.state.append_tokens(torch.from_numpy(tokens) if as_tensor else tokens)
        for request, token in zip(self.requests, tokens.tolist()):
            request.output_ids = request.output_ids + [token]

    @invariant()
    def equal_to_the_list_builders(self):
        if hasattr(self, "state"):
            assert self.state.requests == self.requests
            assert_state_matches_requests(self.state, self.requests)


# A fixed seed and budget: deterministic, and a few seconds in CI.
# (The seed goes on the machine class: hypothesis reads it there, not on its TestCase.)
TestBatchStateMachine = seed(20261130)(BatchStateMachine).TestCase
TestBatchStateMachine.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("device", DEVICES)
def test_state_equals_list_builders_on_random_batches(rng, device):
    state, requests = BatchState(capacity=2), []
    for step in range(30):
        for _ in range(rng.randint(0, 6)):
            request = random_request(rng, len(requests) + 100 * step)
            state.add(request)
            requests.append(request)
        if requests and rng.random() < 0.5:
            drop = sorted(rng.sample(range(len(requests)), rng.randint(1, len(requests))))
            state.remove(drop)
            requests = [r for i, r in enumerate(requests) if i not in set(drop)]
        tokens = np.array([rng.randrange(1 << 17) for _ in requests], dtype=np.int64)
        state.append_tokens(tokens)
        for r, t in zip(requests, tokens.tolist()):
            r.output_ids = r.output_ids + [t]
        assert_state_matches_requests(state, requests, device)
        if device == "cuda":
            torch.cuda.synchronize()


def test_flags_come_from_counters():
    state = BatchState()
    assert state.is_all_greedy and not (state.need_top_p or state.need_top_k or state.need_min_p)
    state.add(Request([1], sampling_params=SamplingParams(temperature=0.0)))
    state.add(Request([2], sampling_params=SamplingParams(top_p=0.5, min_p=0.1, repetition_penalty=1.1)))
    assert not state.is_all_greedy and state.need_top_p and state.need_top_k and state.need_min_p
    assert state.need_penalties
    state.remove([1])
    assert state.is_all_greedy and state.need_top_k and not state.need_top_p and not state.need_min_p
    assert not state.need_penalties
    state.filter([])
    assert len(state) == 0 and state.is_all_greedy and not state.need_top_k


def test_numpy_columns_are_staged_without_fallback():
    state = BatchState()
    for i in range(50):
        state.add(Request([i + 1], req_pool_idx=i, sampling_params=SamplingParams(frequency_penalty=0.5)))
    before = pinstage.stats(device="cpu")["fallbacks"]
    state.decode_inputs(device="cpu")
    state.sampling_batch(enable_deterministic_sampling=True, device="cpu")
    state.penalty_last_token_ids(device="cpu")
    assert pinstage.stats(device="cpu")["fallbacks"] == before


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: Request([], []), ValueError, "no last token"),
        (lambda: Request([1], req_pool_idx=-1), ValueError, "req_pool_idx must be in"),
        (lambda: Request([1], req_pool_idx=2.0), TypeError, "req_pool_idx must be an int"),
        (lambda: Request(["x"]), TypeError, "last token id must be an int"),
        (lambda: Request([2**64]), ValueError, "last token id must be in"),
    ],
)
def test_add_refuses_bad_requests_and_leaves_the_state_unchanged(make, error, message):
    state = BatchState()
    state.add(Request([5], [6], req_pool_idx=3))
    with pytest.raises(error, match=message):
        state.add(make())
    assert len(state) == 1 and state.decode_inputs(device="cpu").input_ids.tolist() == [6]


def test_add_revalidates_params_changed_after_construction():
    params = SamplingParams()
    params.top_k = 2.5
    with pytest.raises(TypeError, match="top_k must be an int"):
        BatchState().add(Request([1], sampling_params=params))


def test_top_k_minus_one_set_after_construction_is_refused_by_both_shapes():
    params = SamplingParams()
    params.top_k = -1  # the constructor stores -1 as TOP_K_ALL; afterwards it is just out of range
    with pytest.raises(ValueError, match=r"BatchState.add: sampling_params: top_k must be >= 1"):
        BatchState().add(Request([1], sampling_params=params))
    with pytest.raises(ValueError, match=r"request 0: top_k must be >= 1"):
        build_sampling_batch([params], device="cpu")


def test_top_k_beyond_int32_is_refused_as_the_list_builder_refuses_it():
    """top_ks is an int32 column: 2**31 raised a bare numpy OverflowError naming no field, after
    part of the row was written. Now the list builder's (torch.tensor's) RuntimeError, naming the
    field, the value and the dtype; the state is unchanged."""
    params = SamplingParams(top_k=2**31)
    state = BatchState()
    state.add(Request([5], [6]))
    with pytest.raises(
        RuntimeError,
        match=r"BatchState.add: sampling_params.top_k = 2147483648 cannot be "
        r"converted to torch.int32: value cannot be converted to type int32",
    ):
        state.add(Request([1], sampling_params=params))
    with pytest.raises(RuntimeError, match=r"request 0: top_k = 2147483648 cannot be converted to torch.int32"):
        build_sampling_batch([params], device="cpu")
    assert len(state) == 1 and state.sampling_batch(device="cpu").top_ks.tolist() == [SamplingParams().top_k]
    state.add(Request([1], sampling_params=SamplingParams(top_k=2**31 - 1)))
    assert state.sampling_batch(device="cpu").top_ks.tolist()[1] == 2**31 - 1


def test_filter_and_append_tokens_check_their_arguments():
    state = BatchState()
    for i in range(3):
        state.add(Request([i + 1]))
    with pytest.raises(IndexError, match="slot 3 is outside the batch of 3"):
        state.filter([0, 3])
    with pytest.raises(ValueError, match="more than once"):
        state.filter([1, 1])
    with pytest.raises(IndexError, match=r"BatchState.remove: slot -1 is outside the batch of 3"):
        state.remove([-1])  # numpy would read -1 as the last slot
    with pytest.raises(ValueError, match="expected 3 tokens"):
        state.append_tokens(np.zeros(2, dtype=np.int64))
    with pytest.raises(TypeError, match="must be integers"):
        state.append_tokens(np.zeros(3, dtype=np.float32))
    with pytest.raises(TypeError, match=r"token 2 must be an int, got float 3.0"):
        state.append_tokens([1, 2, 3.0])
    assert state.decode_inputs(device="cpu").input_ids.tolist() == [1, 2, 3]


def three_requests():
    state = BatchState()
    for i in range(3):
        state.add(Request([i + 1], req_pool_idx=i))
    return state


@pytest.mark.parametrize(
    "slots, error, message",
    [
        ([True, False, True], TypeError, r"got bool True at index 0 \(a boolean mask is not accepted"),
        (np.array([True, False, True]), TypeError, r"got dtype bool \(a boolean mask is not accepted"),
        (torch.tensor([False, True, False]), TypeError, r"got dtype bool \(a boolean mask"),
        ([0, True], TypeError, r"got bool True at index 1"),
        ([0.0, 1.0], TypeError, r"slots must be ints, got float 0.0 at index 0"),
        (np.array([0.0, 1.0]), TypeError, r"slots must be ints, got dtype float64"),
        (["0", "1"], TypeError, r"slots must be ints, got str '0' at index 0"),
        (np.array([0, 2**64 - 1], dtype=np.uint64), IndexError, r"slot 18446744073709551615 is outside the batch of 3"),
        ([0, 2**70], IndexError, r"slot 1180591620717411303424 is outside the batch of 3"),
        ([[0, 1]], TypeError, r"slots must be ints, got list \[0, 1\] at index 0"),
        (np.array([[0, 1]]), ValueError, r"slots must be a 1-D list of ints, got shape \(1, 2\)"),
        (np.array([1.7], dtype=object), TypeError, r"slots must be ints, got float 1.7 at index 0"),
        (np.array([False, True], dtype=object), TypeError, r"got bool False at index 0 \(a boolean mask"),
    ],
)
@pytest.mark.parametrize("method", ["filter", "remove"])
def test_filter_and_remove_take_integer_slots_only(method, slots, error, message):
    """A boolean mask is refused, not read as slots 0 and 1; the state is unchanged."""
    state = three_requests()
    with pytest.raises(
        error,
        match=rf"BatchState.{method}: .*{message}" if error is not IndexError else rf"BatchState.{method}: {message}",
    ):
        getattr(state, method)(slots)
    assert len(state) == 3 and state.decode_inputs(device="cpu").input_ids.tolist() == [1, 2, 3]


@pytest.mark.parametrize("method", ["filter", "remove"])
def test_empty_and_integer_slot_types_are_accepted(method):
    for slots in (
        [],
        np.array([], dtype=np.int64),
        [np.int32(1)],
        np.array([1], dtype=np.uint8),
        torch.tensor([1]),
        [np.uint64(1)],
        np.array([1], dtype=object),
    ):
        state = three_requests()
        getattr(state, method)(slots)
        expected = {"filter": [[], [2]], "remove": [[1, 2, 3], [1, 3]]}[method][len(slots)]
        assert state.decode_inputs(device="cpu").input_ids.tolist() == expected, (method, slots)


@pytest.mark.parametrize("token", [2**63, 2**64 - 1, 2**70])
@pytest.mark.parametrize("kind", ["uint64 array", "uint64 tensor", "list"])
def test_append_tokens_refuses_tokens_beyond_int64_as_add_does(token, kind):
    if kind != "list" and token >= 2**64:
        pytest.skip("not a uint64")
    state = three_requests()
    tokens = {
        "uint64 array": lambda: np.array([7, token, 9], dtype=np.uint64),
        "uint64 tensor": lambda: torch.tensor(np.array([7, token, 9], dtype=np.uint64)),
        "list": lambda: [7, token, 9],
    }[kind]()
    with pytest.raises(
        ValueError, match=rf"BatchState.append_tokens: token 1 must be in \[-{2**63}, {2**63 - 1}\], got {token}$"
    ):
        state.append_tokens(tokens)
    with pytest.raises(ValueError, match="last token id must be in"):
        state.add(Request([token]))
    assert state.decode_inputs(device="cpu").input_ids.tolist() == [1, 2, 3]
    state.append_tokens(np.array([7, 2**63 - 1, 9], dtype=np.uint64))  # the largest int64 is stored exactly
    assert state.decode_inputs(device="cpu").input_ids.tolist() == [7, 2**63 - 1, 9]


def test_sampling_tensors_are_staged_again_only_when_membership_changes(rng):
    """Like vLLM's InputBatch: a decode step (append_tokens) reuses the staged sampling tensors;
    add / filter / remove / merge, or other arguments, stage them again, with the new values."""
    state, requests = BatchState(), [random_request(rng, i) for i in range(12)]
    for r in requests[:8]:
        state.add(r)
    members = requests[:8]

    def calls():
        return pinstage.stats(device="cpu")["calls"]

    def check(expect_staging, deterministic=False):
        before = calls()
        got = state.sampling_batch(enable_deterministic_sampling=deterministic, device="cpu")
        assert calls() - before == int(expect_staging)
        want = build_sampling_batch(
            [r.sampling_params for r in members], enable_deterministic_sampling=deterministic, device="cpu"
        )
        assert_fields_equal(got, want)
        return got

    first = check(True)
    assert check(False) is first
    state.append_tokens(np.arange(8))
    state.decode_inputs(device="cpu")
    assert check(False) is first
    check(True, deterministic=True)
    check(False, deterministic=True)
    state.add(requests[8])
    members = members + [requests[8]]
    check(True, deterministic=True)
    state.filter([8, 0, 1, 2, 3, 4, 5, 6])
    members = [members[i] for i in [8, 0, 1, 2, 3, 4, 5, 6]]
    check(True, deterministic=True)
    state.remove([0])
    members = members[1:]
    check(True, deterministic=True)
    other = BatchState()
    for r in requests[9:]:
        other.add(r)
    state.merge(other)
    members = members + requests[9:]
    check(True, deterministic=True)
    state.filter(range(len(state)))  # same members, same order: still a new version, restaged
    check(True, deterministic=True)


@pytest.mark.cuda
def test_staged_sampling_tensors_are_kept_per_stream(rng):
    """A copy ordered on one stream is not handed to another: a different (or different current)
    stream gets its own staging."""
    state = BatchState()
    for i in range(64):
        state.add(random_request(rng, i))
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    on_a = state.sampling_batch(stream=a)
    assert state.sampling_batch(stream=a) is on_a
    on_b = state.sampling_batch(stream=b)
    assert on_b is not on_a
    with torch.cuda.stream(a):
        current_a = state.sampling_batch()
    assert current_a is not on_b
    with torch.cuda.stream(a):
        assert state.sampling_batch() is current_a
    torch.cuda.synchronize()
    assert_fields_equal(current_a, reference_sampling_batch([r.sampling_params for r in state.requests], "cuda"))


def restaged_sampling_batch(state, stream):
    """sampling_batch after a membership change (filter keeping every slot, in order), so that it
    stages: a call with none returns what it staged before and would time nothing."""
    state.filter(np.arange(len(state)))
    return state.sampling_batch(enable_deterministic_sampling=True, stream=stream)


@pytest.mark.cuda
def test_batch_state_builders_do_not_wait_for_a_busy_stream(rng):
    state = BatchState()
    requests = [random_request(rng, i) for i in range(256)]
    for r in requests:
        state.add(r)
    stream = torch.cuda.Stream()
    params = [r.sampling_params for r in requests]
    pairs = [
        (lambda: state.decode_inputs(stream=stream), lambda: reference_decode_inputs(requests, "cuda")),
        (lambda: state.penalty_last_token_ids(stream=stream), lambda: reference_last_token_ids(requests, "cuda")),
        (
            lambda: restaged_sampling_batch(state, stream),
            lambda: reference_sampling_batch(params, "cuda", enable_deterministic_sampling=True),
        ),
    ]
    for build, expected in pairs:
        build()
        result, still_busy = run_while_stream_busy(build, stream)
        assert still_busy, "the builder returned only after the busy stream finished"
        torch.cuda.synchronize()
        if isinstance(result, torch.Tensor):
            assert_same_tensor(result, expected())
        else:
            assert_fields_equal(result, expected())


def test_append_tokens_reads_lists_entry_by_entry():
    """numpy would read [np.uint64(1), 2, 3] as float64, [] as float64 and [True, 5, 6] as ints."""
    empty = BatchState()
    empty.append_tokens([])
    assert len(empty) == 0
    state = three_requests()
    state.append_tokens([np.uint64(7), 8, np.int32(9)])
    assert state.decode_inputs(device="cpu").input_ids.tolist() == [7, 8, 9]
    with pytest.raises(TypeError, match=r"^BatchState.append_tokens: token 0 must be an int, got bool True$"):
        state.append_tokens([True, 5, 6])  # add() refuses a bool token too
    with pytest.raises(ValueError, match=r"expected 3 tokens \(one per request\), got 2$"):
        state.append_tokens([5, 6])
    assert state.decode_inputs(device="cpu").input_ids.tolist() == [7, 8, 9]
