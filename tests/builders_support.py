"""Shared pieces of the builder tests: devices, the three backends, tensor equality, a busy stream."""
import time

import pytest
import torch

from pinstage.builders import BACKENDS, Request

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
DEVICES = ["cpu", pytest.param("cuda", marks=[needs_cuda, pytest.mark.cuda])]
BATCH_SIZES = [0, 1, 37, 4096]

# About 25 ms of device time on an H200 (~1980 cycles per microsecond): far longer than any builder
# call, so a builder that waited for the stream would take at least this long on the host.
BUSY_CYCLES = 50_000_000


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


def assert_same_tensor(actual, expected, name=""):
    assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert actual.device == expected.device, (name, actual.device, expected.device)
    assert torch.equal(actual.cpu(), expected.cpu()), (name, actual, expected)


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
    """build() with `stream` busy on a long kernel and synchronisation forbidden; returns the result
    and the host seconds it took. The caller compares the result after synchronising."""
    import pinstage.testing

    with torch.cuda.stream(stream):
        torch.cuda._sleep(BUSY_CYCLES)
    start = time.perf_counter()
    with pinstage.testing.no_sync():
        result = build()
    elapsed = time.perf_counter() - start
    return result, elapsed


def busy_host_limit_s():
    """A call that waited for the busy stream would take the whole sleep; half of it is the bound."""
    return BUSY_CYCLES / 1980e6 / 2
