"""At run time, misuse of pinstage.builders raises a TypeError naming what was expected (not an
AttributeError). The static side (mypy as under --strict on pinstage.builders, on code shaped like an
engine's, on the README's builders example, and flagging these misuses) runs once, in .ci/run: see
tests/typecheck."""

import numpy as np
import pytest

from pinstage.builders import (
    BatchState,
    Request,
    SamplingParams,
    build_decode_inputs,
    build_penalty_last_token_ids,
    build_sampling_batch,
)
from pinstage.builders._checks import is_plain_int_list


@pytest.mark.parametrize(
    "misuse, message",
    [
        (
            lambda: BatchState().add(SamplingParams()),
            r"^BatchState.add: expected a request with origin_input_ids, output_ids, sampling_params, "
            r"got SamplingParams without origin_input_ids$",
        ),
        (
            lambda: BatchState().add(Request([1], sampling_params=None)),
            r"^BatchState.add: sampling_params: expected sampling parameters with temperature, .*, "
            r"got NoneType without temperature$",
        ),
        (
            lambda: build_sampling_batch([Request([1])], device="cpu"),
            r"^build_sampling_batch: request 0: expected sampling parameters \(a request's .sampling_params\) "
            r"with temperature, .*, got Request without temperature$",
        ),
        (
            lambda: build_sampling_batch([SamplingParams(), None], device="cpu"),
            r"^build_sampling_batch: request 1: expected sampling parameters .* got NoneType without temperature$",
        ),
        (
            lambda: build_sampling_batch(SamplingParams(), device="cpu"),
            r"^build_sampling_batch: expected a list of sampling parameters, one per request, got SamplingParams$",
        ),
        (
            lambda: build_decode_inputs(Request([1]), device="cpu"),
            r"^build_decode_inputs: expected a list of requests, one per request, got Request$",
        ),
        (
            lambda: build_decode_inputs([Request([1]), SamplingParams()], device="cpu"),
            r"^build_decode_inputs: request 1: expected a request with origin_input_ids, output_ids, "
            r"got SamplingParams without origin_input_ids$",
        ),
        (
            lambda: build_decode_inputs(
                [type("NoRow", (), {"origin_input_ids": [1], "output_ids": []})()], device="cpu"
            ),
            r"^build_decode_inputs: request 0: expected a request with req_pool_idx or kv.req_pool_idx, got NoRow$",
        ),
        (
            lambda: build_penalty_last_token_ids("abc", device="cpu"),
            r"^build_penalty_last_token_ids: expected a list of requests, one per request, got str$",
        ),
        (lambda: BatchState().merge([Request([1])]), r"^BatchState.merge: expected a BatchState, got list$"),
    ],
)
def test_misuse_raises_type_error_naming_what_was_expected(misuse, message):
    with pytest.raises(TypeError, match=message):
        misuse()


def test_a_plain_int_list_is_a_list_of_exact_ints():
    """The builders' fast paths hand such a list to the converter as it is; anything else (a bool,
    an int subclass, a numpy int, a tuple) takes the path that looks at each entry."""

    class Int(int):
        pass

    class List(list):
        pass

    assert is_plain_int_list([]) and is_plain_int_list([0, -1, 2**70])  # beyond int64: the converter refuses it
    for other in ([True], [1, Int(2)], [1, 1.0], [np.int64(1)], List([1]), (1, 2), np.array([1]), None):
        assert not is_plain_int_list(other), other
