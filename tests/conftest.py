import functools
import sys

import pytest
from support import ROOT

# An installed pinstage wins; an in-place build in the checkout is found otherwise (and bench.engines).
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.engines.source import Unavailable  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large sizes (1M elements); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "cuda(devices=1): needs that many CUDA devices; skipped where fewer are visible")
    config.addinivalue_line("markers", "no_gpu: needs no GPU visible; scripts/test.sh runs it with CUDA hidden")


@functools.cache
def _cuda_devices():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A cuda-marked test skips where fewer GPUs than it asks for are visible, before its fixtures
    run. The skip is raised here, not added as a mark, so that the summary folds every such skip into one line
    ("SKIPPED [N] tests/conftest.py:..."); other skip reasons keep their own lines. An engine's
    source that is not here skips the tests that ask for it, in a fixture or in the body (both
    phases run through _skipped_without_engine_source). A no_gpu test skips where a GPU is
    visible; the README's test command runs those with CUDA hidden."""
    if item.get_closest_marker("no_gpu") is not None and _cuda_devices() > 0:
        pytest.skip("needs no visible GPU (scripts/test.sh runs it with CUDA_VISIBLE_DEVICES empty)")
    marker = item.get_closest_marker("cuda")
    if marker is not None:
        need = marker.kwargs.get("devices", 1)
        if _cuda_devices() == 0:
            pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
        if _cuda_devices() < need:
            pytest.skip("needs %d CUDA devices (%d visible)" % (need, _cuda_devices()))
    return (yield from _skipped_without_engine_source())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _skipped_without_engine_source())


def _skipped_without_engine_source():
    """Runs a test's phase (setup: its fixtures; call: its body); an engine's source that is not
    here skips the test, saying why, wherever it was asked for."""
    try:
        return (yield)
    except Unavailable as why:
        pytest.skip(str(why))


@pytest.fixture
def rng(request):
    """A random.Random seeded from the test's id, so every run of a test sees the same values."""
    from staging_reference import seeded_rng

    return seeded_rng(request.node.nodeid)


@pytest.fixture
def cuda_ring():
    """The default ring settings back after each CUDA test."""
    import torch

    import pinstage

    pinstage.stage_to_device([0], torch.int64)
    torch.cuda.synchronize()
    ring = pinstage.stats()["ring_bytes"]
    yield
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    pinstage.configure(ring_bytes=ring, on_full="overflow")
