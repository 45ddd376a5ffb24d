"""BatchState.stage_static: a step's fields into a pinstage.StaticInputs in one copy.

The reference for rows [0, n) of every field is torch.tensor of the list-of-requests builders'
values (build_decode_inputs, build_sampling_batch: no ring, no StaticInputs) on the same requests, and
torch.tensor for the caller's extra values; rows [n, max_bs) hold the fill the StaticInputs declares.
"""

import numpy as np
import pytest
import torch
from gpu_busy import assert_still_busy, busy, captured
from staging_reference import assert_same_tensor, assert_views
from support import DEVICES, random_params, random_requests, reference_decode_inputs, reference_sampling_batch

import pinstage
import pinstage.testing
from pinstage import Field, StaticInputs
from pinstage.builders import BATCH_STATE_FIELDS, BatchState, batch_static_inputs
from pinstage.builders.requests import NO_PENALTIES

# The caller's per-step values that are not columns of the state.
EXTRA_FIELDS = {"positions": Field(torch.int64), "out_cache_loc": Field(torch.int32, fill=-1)}
PENALTY_NAMES = ("frequency_penalties", "presence_penalties", "repetition_penalties")


def new_requests(rng, bs):
    requests = random_requests(rng, bs)
    for request, params in zip(requests, random_params(rng, bs)):
        params.presence_penalty = rng.choice([0.0, 0.0, 0.25])  # random_params sets the other two
        request.sampling_params = params
    return requests


def resize(state, requests, target, rng):
    """The batch at `target` requests: random ones leave (filter) or new ones join (add); returns the
    requests in the state's order."""
    if target < len(requests):
        keep = sorted(rng.sample(range(len(requests)), target))
        state.filter(keep)
        requests = [requests[i] for i in keep]
    for request in new_requests(rng, target - len(requests)):
        state.add(request)
        requests = requests + [request]
    return requests


def extra_values(rng, n, form):
    """positions and out_cache_loc for n requests, as a list, a numpy array or a CPU tensor."""
    positions = [rng.randrange(1 << 20) for _ in range(n)]
    locations = [rng.randrange(1 << 30) for _ in range(n)]
    if form == "numpy":
        return {"positions": np.array(positions, dtype=np.int64), "out_cache_loc": np.array(locations)}
    if form == "tensor":
        return {"positions": torch.tensor(positions), "out_cache_loc": torch.tensor(locations, dtype=torch.int32)}
    return {"positions": positions, "out_cache_loc": locations}


def reference_rows(requests, extra):
    """Field -> CPU tensor of the batch's rows, from the list builders (on the CPU) and torch.tensor."""
    decode = reference_decode_inputs(requests, "cpu")
    params = [r.sampling_params for r in requests]
    sampling = reference_sampling_batch(params, "cpu", enable_deterministic_sampling=True)
    rows = {
        "input_ids": decode.input_ids,
        "seq_lens": decode.seq_lens,
        "req_pool_indices": decode.req_pool_indices,
        "temperatures": sampling.temperatures,
        "top_ps": sampling.top_ps,
        "top_ks": sampling.top_ks,
        "min_ps": sampling.min_ps,
        "seeds": sampling.seeds,
    }
    for k, name in enumerate(PENALTY_NAMES):  # the builder leaves penalties out when no request has any
        rows[name] = (
            sampling.penalties[:, k]
            if sampling.penalties is not None
            else torch.full((len(requests),), NO_PENALTIES[k], dtype=torch.float32)
        )
    rows.update({name: torch.as_tensor(v, dtype=EXTRA_FIELDS[name].dtype) for name, v in extra.items()})
    return rows


def reference_views(inputs, fields, requests, extra):
    """What every view of `inputs` (declared as `fields`) must hold after stage_static."""
    rows, n = reference_rows(requests, extra), len(requests)
    return {
        name: torch.cat(
            [rows[name].reshape((n,) + f.shape), torch.full((inputs.max_bs - n,) + f.shape, f.fill, dtype=f.dtype)]
        )
        for name, f in fields.items()
    }


def all_fields():
    return {**BATCH_STATE_FIELDS, **EXTRA_FIELDS}


@pytest.mark.parametrize("device", DEVICES)
def test_views_equal_the_list_builders_row_for_row_and_the_fill_past_the_batch(rng, device):
    """Through joins, leaves (the batch shrinks: rows it left must get the fill back) and sampled
    tokens, every step's views equal the list builders on the same requests."""
    max_bs = 48
    inputs = batch_static_inputs(max_bs, EXTRA_FIELDS, seeds=True, penalties=True, device=device)
    assert inputs.names == tuple(all_fields())
    state, requests = BatchState(capacity=4), []  # capacity 4: the columns grow on the way
    for step, target in enumerate([5, max_bs, 0, 1, 30, 7, max_bs, 12]):
        requests = resize(state, requests, target, rng)
        tokens = np.array([rng.randrange(1 << 17) for _ in requests], dtype=np.int64)
        state.append_tokens(tokens)
        for r, t in zip(requests, tokens.tolist()):
            r.output_ids = r.output_ids + [t]
        extra = extra_values(rng, len(requests), ["list", "numpy", "tensor"][step % 3])
        state.stage_static(inputs, extra)
        if device == "cuda":
            torch.cuda.synchronize()
        assert_views(inputs, reference_views(inputs, all_fields(), requests, extra), "step %d (n=%d)" % (step, target))


@pytest.mark.parametrize("device", DEVICES)
def test_steps_between_membership_changes_stage_the_columns_as_they_are_now(rng, device):
    """stage_static reuses its column views until the membership changes: steps that only append
    tokens must still stage the new tokens and lengths, a join past the capacity (new columns) and
    a second StaticInputs with other fields, staged in between, must not see stale views."""
    inputs = batch_static_inputs(16, EXTRA_FIELDS, seeds=True, penalties=True, device=device)
    other_fields = {"input_ids": Field(torch.int64, fill=3), "seq_lens": Field(torch.int64)}
    other = StaticInputs(other_fields, max_bs=16, device=device)
    state, requests = BatchState(capacity=4), []
    requests = resize(state, requests, 4, rng)
    for step in range(6):
        if step == 3:
            requests = resize(state, requests, 9, rng)  # past capacity 4: the columns are new arrays
        tokens = np.array([rng.randrange(1 << 17) for _ in requests], dtype=np.int64)
        state.append_tokens(tokens)
        for r, t in zip(requests, tokens.tolist()):
            r.output_ids = r.output_ids + [t]
        extra = extra_values(rng, len(requests), "numpy")
        state.stage_static(inputs, extra)
        if step >= 4:  # after steps of `inputs` alone, whose views it kept
            state.stage_static(other)
        if device == "cuda":
            torch.cuda.synchronize()
        where = "step %d (n=%d)" % (step, len(requests))
        assert_views(inputs, reference_views(inputs, all_fields(), requests, extra), where)
        if step >= 4:
            assert_views(other, reference_views(other, other_fields, requests, {}), where + ", other inputs")


def test_stages_exactly_the_fields_a_static_inputs_declares(rng):
    """A StaticInputs declared by the caller (its own fills and row shapes, no penalties or seeds,
    no extra) takes only its own fields from the state."""
    fields = {
        "input_ids": Field(torch.int64, fill=7),
        "temperatures": Field(torch.float32, fill=2.0),
        "top_ks": Field(torch.int64, fill=-1),
    }
    inputs = StaticInputs(fields, max_bs=16)
    state, requests = BatchState(), new_requests(rng, 9)
    for request in requests:
        state.add(request)
    state.stage_static(inputs)
    assert_views(inputs, reference_views(inputs, fields, requests, {}), "own declaration")


def test_helper_declares_seeds_and_penalties_only_when_asked():
    inputs = batch_static_inputs(4)
    assert inputs.names == tuple(n for n in BATCH_STATE_FIELDS if n != "seeds" and n not in PENALTY_NAMES)
    assert set(batch_static_inputs(4, seeds=True).names) - set(inputs.names) == {"seeds"}
    assert set(batch_static_inputs(4, penalties=True).names) - set(inputs.names) == set(PENALTY_NAMES)
    with pytest.raises(ValueError, match="extra names 'seq_lens'"):
        batch_static_inputs(4, {"seq_lens": Field(torch.int32)})
    with pytest.raises(TypeError, match="extra must be a dict"):
        batch_static_inputs(4, [("positions", Field(torch.int64))])


@pytest.mark.parametrize(
    "extra, n, error, message",
    [
        (None, 3, KeyError, "no values for 'positions', 'out_cache_loc'"),
        ({"positions": [1, 2, 3]}, 3, KeyError, "no values for 'out_cache_loc'"),
        (
            {"positions": [1, 2, 3], "out_cache_loc": [1, 2, 3], "input_ids": [1, 2, 3]},
            3,
            ValueError,
            "extra names 'input_ids', which the batch state stages itself",
        ),
        (
            {"positions": [1, 2, 3], "out_cache_loc": [1, 2, 3], "page_table": [1, 2, 3]},
            3,
            ValueError,
            "unknown field 'page_table'",
        ),
        ({"positions": [1, 2], "out_cache_loc": [1, 2, 3]}, 3, ValueError, "field .positions."),
        (
            {"positions": [1, 2, 3], "out_cache_loc": [1, "x", 3]},
            3,
            TypeError,
            "field .out_cache_loc.: .*element \\[1\\] = .x.",
        ),
        ([("positions", [1, 2, 3])], 3, TypeError, "extra must be a dict"),
        ({"positions": list(range(9)), "out_cache_loc": list(range(9))}, 9, ValueError, "max_bs=8"),
    ],
)
def test_errors_name_the_fields_and_stage_nothing(rng, extra, n, error, message):
    inputs = batch_static_inputs(8, EXTRA_FIELDS)
    state, requests = BatchState(), new_requests(rng, 5)
    for request in requests:
        state.add(request)
    good = extra_values(rng, 5, "list")
    state.stage_static(inputs, good)
    before = {name: inputs[name].clone() for name in inputs.names}
    state.filter(range(min(n, 5)))
    for request in new_requests(rng, n - 5):
        state.add(request)
    with pytest.raises(error, match=message):
        state.stage_static(inputs, extra)
    assert_views(inputs, before, "after a refused stage_static")


# ------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("side_stream", [False, True])
def test_one_copy_per_call_on_the_callers_stream_without_waiting(rng, cuda_ring, side_stream):
    inputs = batch_static_inputs(64, EXTRA_FIELDS, seeds=True, penalties=True, device="cuda")
    state, requests = BatchState(), new_requests(rng, 40)
    for request in requests:
        state.add(request)
    extra = extra_values(rng, len(requests), "numpy")
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())  # the views' initial fill is ordered before
    done = busy(100, stream)
    before = pinstage.stats()
    with pinstage.testing.no_sync():
        state.stage_static(inputs, extra, stream=stream if side_stream else None)
    after = pinstage.stats()
    assert_still_busy(done, "stage_static returned")
    assert after["copies"] - before["copies"] == 1
    assert after["calls"] - before["calls"] == 1
    torch.cuda.synchronize()
    assert_views(inputs, reference_views(inputs, all_fields(), requests, extra), "after the busy stream")


def graph_step(v):
    """A step that reads every field, as a captured decode step reads its static inputs."""
    address = v["input_ids"] * 3 + v["seq_lens"] * 1000 + v["req_pool_indices"] + v["positions"] - v["out_cache_loc"]
    sampling = (
        v["temperatures"].view(-1) * v["top_ps"]
        + v["min_ps"]
        + v["frequency_penalties"]
        - v["presence_penalties"] * v["repetition_penalties"]
    )
    return address, sampling, v["top_ks"].clamp(max=1 << 20) + (v["seeds"] % 1000).to(torch.int32)


@pytest.mark.cuda
def test_graph_captured_on_the_views_replays_as_eager_after_each_stage(rng, cuda_ring):
    """A graph captured once on the views, replayed after each step's stage_static (queued behind a
    sleep, through membership changes and a small ring that is reused under the copies), gives what
    the same step computes eagerly on the list builders' tensors padded with the fills."""
    max_bs = 32
    inputs = batch_static_inputs(max_bs, EXTRA_FIELDS, seeds=True, penalties=True, device="cuda")
    views = {name: inputs[name] for name in inputs.names}
    graph, outs = captured(lambda: graph_step(views))
    first, last = views[inputs.names[0]], views[inputs.names[-1]]
    pinstage.configure(ring_bytes=3 * (last.data_ptr() + last.nbytes - first.data_ptr()), on_full="overflow")

    state, requests = BatchState(), []
    results, expected = [], []
    overflows = pinstage.stats()["overflows"]
    done = busy(100)
    for target in [32, 3, 17, 0, 31, 8, 8, 20] * 4:
        requests = resize(state, requests, target, rng)
        extra = extra_values(rng, target, "tensor")
        state.stage_static(inputs, extra)
        graph.replay()
        results.append(tuple(o.clone() for o in outs))
        expected.append(graph_step(reference_views(inputs, all_fields(), requests, extra)))
    assert_still_busy(done, "the stages and replays were queued")
    torch.cuda.synchronize()
    assert pinstage.stats()["overflows"] > overflows, "the ring was never full: its reuse was not exercised"
    for k, (got, want) in enumerate(zip(results, expected)):
        for j, (g, w) in enumerate(zip(got, want)):
            assert_same_tensor(g, w.to(inputs.device), "replay %d, output %d" % (k, j))
