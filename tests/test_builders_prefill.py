"""A prefill's inputs in one copy: the logits and sampling builders' host halves staged with the
prefill's other lists in one stage_many give the tensors the builders give on their own."""

import pytest
import torch
from staging_reference import assert_same_tensor
from support import DEVICES, assert_fields_equal, random_params, run_while_stream_busy

import pinstage
from pinstage.builders import (
    BatchState,
    LogprobIndices,
    Request,
    build_logprob_indices,
    build_sampling_batch,
    logprob_index_tensors,
    sampling_fields,
)


def prefill_values(rng, bs):
    lens = [rng.randint(1, 40) for _ in range(bs)]
    starts = [rng.choice([n, rng.randint(0, n), 0]) for n in lens]
    ids = [rng.randint(0, 50_000) for _ in range(sum(lens))]
    positions = [i for n in lens for i in range(n)]
    return lens, starts, ids, positions, random_params(rng, bs)


def stage_prefill(lens, starts, ids, positions, params, sampling_source=None, **where):
    """sampling_source: None (the list builder's values) or a BatchState of the prefill's requests."""
    fields, sampling_batch = sampling_fields(params) if sampling_source is None else sampling_source.sampling_fields()
    items = [(ids, torch.int64), (positions, torch.int64)]
    items += [(t, torch.int64) for t in logprob_index_tensors(lens, starts)]
    items += [(values, dtype) for _, values, dtype in fields]
    staged = pinstage.stage_many(items, **where)
    return staged[0], staged[1], LogprobIndices(*staged[2:6]), sampling_batch(staged[6:])


def assert_equals_the_builders(staged, values, device):
    lens, starts, ids, positions, params = values
    ids_d, positions_d, indices, batch = staged
    assert_same_tensor(ids_d, torch.tensor(ids, dtype=torch.int64, device=device), "input ids")
    assert_same_tensor(positions_d, torch.tensor(positions, dtype=torch.int64, device=device), "positions")
    assert_fields_equal(indices, build_logprob_indices(lens, starts, device=device))
    assert_fields_equal(batch, build_sampling_batch(params, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", [1, 9, 300])
def test_one_staging_equals_the_builders(rng, device, bs):
    values = prefill_values(rng, bs)
    assert_equals_the_builders(stage_prefill(*values, device=device), values, device)


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_values_from_the_joining_requests_batch_state(rng, device):
    """A prefill batch's own BatchState (its requests added as they join) gives the sampling values
    the list builder gives, in the same one staging."""
    values = prefill_values(rng, 40)
    joining = BatchState()
    for row, params in enumerate(values[-1]):
        joining.add(Request([1], req_pool_idx=row, sampling_params=params))
    assert_equals_the_builders(stage_prefill(*values, sampling_source=joining, device=device), values, device)


@pytest.mark.cuda
def test_one_copy_behind_a_busy_stream(rng):
    values = prefill_values(rng, 64)
    stream = torch.cuda.Stream()
    build = lambda: stage_prefill(*values, stream=stream)  # noqa: E731
    build()
    before = pinstage.stats()
    staged, still_busy = run_while_stream_busy(build, stream)
    after = pinstage.stats()
    assert still_busy, "the staging returned only after the busy stream finished"
    assert after["copies"] - before["copies"] == 1
    torch.cuda.synchronize()
    assert_equals_the_builders(staged, values, "cuda")
