"""pinstage.builders fed SGLang 0.5.23's own Req and SamplingParams (from its real scheduler code)
build what SGLang builds: the sampling tensors and flags of a fresh batch, the penalty last-token
ids, decode inputs (seq_lens and request rows after prepare_for_decode), and the logits
processor's sample and input-logprob indices; BatchState.add takes SGLang's requests too."""

import random

import pytest
import torch
from staging_reference import assert_same_tensor
from test_sglang_integration import DEVICES, random_params, sg  # noqa: F401 - sg is the module fixture

from pinstage.builders import (
    BatchState,
    build_decode_inputs,
    build_logprob_indices,
    build_penalty_last_token_ids,
    build_sampling_batch,
)

BATCH_SIZES = [1, 7, 64, 300]


def sglang_batch(sg, device, bs, seed, logprobs=False):  # noqa: F811
    """A prefilled SGLang batch of bs random requests (penalties, seeds, prefix hits, input
    logprobs), one sampled token each."""
    from bench.engines import sglang_stubs

    rng = random.Random(seed)
    world = sglang_stubs.SchedulerWorld(sg, device)
    cached = [rng.randrange(world.vocab_size) for _ in range(30)]
    world.cache_prompt(cached)
    reqs = []
    for _ in range(bs):
        prompt = cached[: rng.randint(0, 30)] + [rng.randrange(world.vocab_size) for _ in range(rng.randint(1, 20))]
        req = world.request(
            prompt,
            random_params(rng, penalties=True, seeds=True),
            return_logprob=logprobs,
            logprob_start_len=rng.choice([-1, 0, rng.randrange(len(prompt))]),
        )
        world.admit(req)
        reqs.append(req)
    return world, world.prefill_batch(reqs)


def sample(batch, rng):
    for r in batch.reqs:
        r.output_ids.append(rng.randrange(1000))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_sampling_batch_equals_sglangs(sg, device, bs):  # noqa: F811
    from sglang.srt.runtime_context import get_exec

    with get_exec().deterministic.override(enable_deterministic_inference=True):
        _, batch = sglang_batch(sg, device, bs, seed=bs)
        ours = build_sampling_batch(
            [r.sampling_params for r in batch.reqs], enable_deterministic_sampling=True, device=device
        )
    info = batch.sampling_info
    for name, theirs in [
        ("temperatures", info.temperatures),
        ("top_ps", info.top_ps),
        ("top_ks", info.top_ks),
        ("min_ps", info.min_ps),
        ("seeds", info.sampling_seed),
    ]:
        assert_same_tensor(getattr(ours, name), theirs, name)
    # A fresh batch: SGLang's flags are exact here (after filter and merge they are upper bounds).
    assert (ours.is_all_greedy, ours.need_top_p, ours.need_top_k, ours.need_min_p) == (
        info.is_all_greedy,
        info.need_top_p_sampling,
        info.need_top_k_sampling,
        info.need_min_p_sampling,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_decode_and_penalty_inputs_equal_sglangs(sg, device, bs, monkeypatch):  # noqa: F811
    _, batch = sglang_batch(sg, device, bs, seed=bs)
    sample(batch, random.Random(bs))
    fed = []
    orchestrator = batch.sampling_info.penalizer_orchestrator
    assert orchestrator.is_required
    monkeypatch.setattr(orchestrator, "cumulate_output_tokens", fed.append)
    batch.prepare_for_decode()
    (sglang_last_tokens,) = fed
    assert_same_tensor(build_penalty_last_token_ids(batch.reqs, device=device), sglang_last_tokens, "last tokens")
    inputs = build_decode_inputs(batch.reqs, device=device)
    assert_same_tensor(inputs.input_ids, sglang_last_tokens, "input_ids")
    assert_same_tensor(inputs.seq_lens, batch.seq_lens, "seq_lens")
    assert_same_tensor(inputs.req_pool_indices, batch.req_pool_indices, "req_pool_indices")

    state = BatchState()
    for r in batch.reqs:
        state.add(r)
    decode = state.decode_inputs(device=device)
    for name in ("input_ids", "seq_lens", "req_pool_indices"):
        assert_same_tensor(getattr(decode, name), getattr(inputs, name), name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_logprob_indices_equal_sglangs(sg, device, bs):  # noqa: F811
    _, batch = sglang_batch(sg, device, bs, seed=bs, logprobs=True)
    from bench.engines import sglang_stubs

    metadata = sglang_stubs.logits_metadata(sg, batch)
    hidden = torch.zeros(sum(batch.extend_lens), 1, device=device)
    _, _, _, sample_indices, input_logprob_indices, _ = sg.LogitsProcessor._get_pruned_states(
        None, hidden, None, None, metadata
    )
    ours = build_logprob_indices(batch.extend_lens, batch.extend_logprob_start_lens, device=device)
    assert_same_tensor(ours.sample_indices, sample_indices, "sample_indices")
    assert_same_tensor(ours.input_logprob_indices, input_logprob_indices, "input_logprob_indices")
