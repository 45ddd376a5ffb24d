import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An installed pinstage wins; an in-place build in the checkout is found otherwise.
if ROOT not in sys.path:
    sys.path.append(ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large sizes (1M elements); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped where none is visible")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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
