import pytest
import torch
from staging_reference import assert_same_tensor
from support import (
    BATCH_SIZES,
    DEVICES,
    assert_fields_equal,
    random_requests,
    reference_decode_inputs,
    reference_last_token_ids,
    run_while_stream_busy,
)

from pinstage.builders import Request, build_decode_inputs, build_penalty_last_token_ids


def expected_last_tokens(requests):
    out = []
    for r in requests:
        out.append(r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1])
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_decode_inputs_equal_torch_tensor_and_reference(rng, device, bs):
    requests = random_requests(rng, bs)
    got = build_decode_inputs(requests, device=device)
    assert_fields_equal(got, reference_decode_inputs(requests, device))  # on the same device
    assert got.input_ids.device.type == device
    ids = build_penalty_last_token_ids(requests, device=device)
    assert_same_tensor(ids, reference_last_token_ids(requests, device))
    assert_same_tensor(ids.cpu(), expected_last_tokens(requests))
    assert_same_tensor(got.input_ids.cpu(), expected_last_tokens(requests))
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) for r in requests]
    assert_same_tensor(got.seq_lens.cpu(), torch.tensor(seq_lens, dtype=torch.int64))
    pool = [r.req_pool_idx for r in requests]
    assert_same_tensor(got.req_pool_indices.cpu(), torch.tensor(pool, dtype=torch.int64))


def test_last_token_is_the_prompt_tail_before_any_output():
    requests = [Request([5, 6, 7]), Request([1], [9, 8])]
    ids = build_penalty_last_token_ids(requests, device="cpu")
    assert ids.tolist() == [7, 8]


def test_request_without_any_token_is_named():
    requests = [Request([1]), Request([2], [3]), Request([], [])]
    with pytest.raises(ValueError, match=r"request 2: origin_input_ids and output_ids are both empty"):
        build_decode_inputs(requests, device="cpu")


def test_negative_pool_index_is_named():
    requests = [Request([1], req_pool_idx=0), Request([2], req_pool_idx=-1)]
    with pytest.raises(ValueError, match=r"request 1: req_pool_idx must be >= 0"):
        build_decode_inputs(requests, device="cpu")


@pytest.mark.cuda
def test_decode_builders_do_not_wait_for_a_busy_stream(rng):
    requests = random_requests(rng, 256)
    stream = torch.cuda.Stream()
    for build in (build_decode_inputs, build_penalty_last_token_ids):
        build(requests, stream=stream)  # warm-up: the ring and caching allocator settle
        result, still_busy = run_while_stream_busy(lambda: build(requests, stream=stream), stream)
        assert still_busy, f"{build.__name__} returned only after the busy stream finished"
        torch.cuda.synchronize()
        if build is build_decode_inputs:
            assert_fields_equal(result, reference_decode_inputs(requests, "cuda"))
        else:
            assert_same_tensor(result, reference_last_token_ids(requests, "cuda"))


@pytest.mark.parametrize("order", ["int first", "bool first"])
def test_a_bool_pool_index_is_named_wherever_it_stands(order):
    """False == 0: a check over the distinct values alone would see one int and accept it."""
    requests = [Request([1], req_pool_idx=0), Request([2], req_pool_idx=False)]
    if order == "bool first":
        requests.reverse()
    bad = 1 if order == "int first" else 0
    with pytest.raises(TypeError, match=rf"request {bad}: req_pool_idx must be an int, got bool False"):
        build_decode_inputs(requests, device="cpu")


def test_a_numpy_int_pool_index_is_taken_as_batch_state_takes_it():
    """BatchState.add and write_cache_indices read numpy ints as rows: the list builder does too."""
    import numpy as np

    from pinstage.builders import BatchState

    requests = [Request([1], req_pool_idx=np.int64(3)), Request([2], req_pool_idx=np.uint8(5))]
    state = BatchState()
    for r in requests:
        state.add(r)
    assert_fields_equal(build_decode_inputs(requests, device="cpu"), state.decode_inputs(device="cpu"))
    requests[1].req_pool_idx = np.int64(-1)
    with pytest.raises(ValueError, match=r"request 1: req_pool_idx must be >= 0, got (np.int64\(-1\)|-1)$"):
        build_decode_inputs(requests, device="cpu")


class _CodedError(ValueError):
    """An error class of the user's whose constructor takes more than a message."""

    def __init__(self, code, detail):
        super().__init__(f"[{code}] {detail}")
        self.code = code


class _TokenIdThatRaises:
    def __index__(self):
        raise _CodedError(7, "token id gone")


def test_a_token_ids_own_error_is_raised_naming_the_request():
    # The value's own error class, though it cannot be made from one message (the location then goes
    # into a note), and no error of the builder's in front of it.
    requests = [Request([1], [5]), Request([1], [_TokenIdThatRaises()])]
    with pytest.raises(_CodedError) as info:
        build_penalty_last_token_ids(requests, device="cpu")
    assert info.value.code == 7 and str(info.value) == "[7] token id gone"
    assert info.value.__notes__[-1].startswith("request 1: last token id = <")
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_an_unconvertible_token_id_names_the_request_without_the_batch_error_before_it():
    requests = [Request([1], [5]), Request([1], [2**64])]
    message = r"^request 1: last token id = 18446744073709551616 cannot be converted to torch.int64: "
    with pytest.raises(ValueError, match=message) as info:
        build_penalty_last_token_ids(requests, device="cpu")
    assert info.value.__context__ is None and info.value.__cause__ is None


class _TokenIdWithAttributeError:
    def __index__(self):
        raise AttributeError("token id gone")


def test_any_error_class_of_a_values_own_code_names_the_request():
    requests = [Request([1], [5]), Request([1], [_TokenIdWithAttributeError()])]
    message = r"^request 1: last token id = <.*> cannot be converted to torch.int64: token id gone$"
    with pytest.raises(AttributeError, match=message):
        build_penalty_last_token_ids(requests, device="cpu")


def test_an_error_instance_raised_again_gets_no_second_set_of_notes():
    # A value that raises the same stored instance each time (as a cached future's result() does).
    stored = _CodedError(7, "token id gone")

    class Stored:
        def __index__(self):
            raise stored

    requests = [Request([1], [Stored()])]
    for _ in range(3):
        with pytest.raises(_CodedError):
            build_penalty_last_token_ids(requests, device="cpu")
        notes = list(stored.__notes__)
    assert len(notes) == len(set(notes)) and notes[-1].startswith("request 0: last token id = <")
