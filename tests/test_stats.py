"""stats() returns exactly the keys of pinstage.Stats, in its order and of its types, on the CPU and
on a CUDA device (the C++ counter list and the Python TypedDict must not drift apart)."""

import typing

import pytest
import torch

import pinstage


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_stats_keys_and_types_are_those_of_the_typed_snapshot(device):
    pinstage.stage_to_device([1, 2], torch.int64, device=device)
    s = pinstage.stats(device)
    hints = typing.get_type_hints(pinstage.Stats)
    assert list(s) == list(hints)
    for key, kind in hints.items():
        assert type(s[key]) is kind, (key, s[key])
    assert s["device"] == str(torch.device(device if device == "cpu" else "cuda:%d" % torch.cuda.current_device()))
    assert s["calls"] >= 1 and s["bytes_staged"] >= 16
