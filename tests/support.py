"""Shared pieces of the builder tests: devices, the three backends, tensor equality, a busy stream."""
import gpu_busy
import pytest
import staging_reference
import torch

from pinstage.builders import BACKENDS, Request, SamplingParams

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BATCH_SIZES = [0, 1, 37, 4096]

# Far longer than any builder call on any GPU (about 25 ms on an H200): the stream is still busy
# when a builder that does not wait for it returns.
BUSY_MS = 25


def random_requests(rng, bs):
    """bs decode requests: prompts of 1-6 tokens, 0-3 output tokens (often none), random rows."""
    return [
        Request(
            [rng.randrange(1 << 17) for _ in range(rng.randint(1, 6))],
            [rng.randrange(1 << 17) for _ in range(rng.choice([0, 0, 1, 3]))],
            req_pool_idx=rng.randrange(8192),
        )
        for _ in range(bs)
    ]


def random_params(rng, bs):
    """bs SamplingParams mixing greedy and sampled requests, ints where floats are expected (common
    in engine code), with and without seeds and penalties."""
    return [
        SamplingParams(
            temperature=rng.choice([0.0, 0.5, 0.7, 1, 1.3]),
            top_p=rng.choice([1.0, 1, 0.9, 0.5]),
            top_k=rng.choice([-1, -1, 1, 20, 50]),
            min_p=rng.choice([0.0, 0, 0.05]),
            sampling_seed=rng.choice([None, rng.randrange(1 << 40)]),
            frequency_penalty=rng.choice([0.0, 0.0, 0.0, 0.5]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.0, 1.2]),
        )
        for _ in range(bs)
    ]


def assert_same_tensor(actual, expected, name=""):
    """Equal values, dtype and shape (staging_reference's check) on the same device."""
    assert actual.device == expected.device, (name, actual.device, expected.device)
    staging_reference.assert_same_tensor(actual, expected.cpu(), name)


def assert_fields_equal(actual, expected):
    """Two builder results (dataclasses): tensors equal in value, dtype, shape and device; the rest ==."""
    for name, value in vars(expected).items():
        other = getattr(actual, name)
        if isinstance(value, torch.Tensor):
            assert_same_tensor(other, value, name)
        else:
            assert other == value, (name, other, value)


def results_by_backend(build, device):
    """build(backend=, device=) for each backend, finished on the device before returning."""
    results = {backend: build(backend=backend, device=device) for backend in BACKENDS}
    if device == "cuda":
        torch.cuda.synchronize()
    return results


def run_while_stream_busy(build, stream):
    """build() right after a long kernel was queued on `stream`, with synchronisation forbidden.
    Returns the result and whether the kernel was still running when build() returned: a builder
    that waited for the stream would find it done. The caller compares the result after
    synchronising."""
    import pinstage.testing

    done = gpu_busy.busy(BUSY_MS, stream)
    with pinstage.testing.no_sync():
        result = build()
    return result, not done.query()
