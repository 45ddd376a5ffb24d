"""The benchmarks' baselines compute what they claim to: the engines' copy patterns give the builders'
results, and the decode loop's unguarded single copy and its snapshots write the static inputs."""
import os
import random
import sys

import numpy as np
import torch
from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import _baselines  # noqa: E402
import _decode_model  # noqa: E402
import builders  # noqa: E402
import decode_loop  # noqa: E402


def test_every_builder_method_gives_the_batch_states_result():
    calls = builders.builder_calls(random.Random(3), 8, "cpu")  # asserts the state methods equal
    for builder in builders.STATE_FIELDS:
        assert set(calls[builder]) == set(builders.METHODS), builder
    expected = calls["sampling"]["batch_state"]()
    for name in builders.METHODS:
        assert builders._same(expected, calls["sampling"][name]()), name
    changed = calls["sampling"]["batch_state"]()
    changed.top_ks[0] += 1
    assert not builders._same(expected, changed)  # the comparison can fail


def test_engine_copy_patterns_give_torch_tensor_values():
    values = np.array([[1.5, 2.0, 0.5], [0.0, -1.0, 2.0]], dtype=np.float32)
    buffer = _baselines.CpuGpuBuffer.empty((4, 3), torch.float32, "cpu")
    assert torch.equal(buffer.write(values), torch.tensor(values))
    assert torch.equal(_baselines.pinned_tensor(values[:, 1], torch.float32, "cpu"), torch.tensor(values[:, 1]))


def _graphs():
    cfg = decode_loop.Config(batch_size=6, forward_ms=0.2, vocab=64, d_model=16, n_heads=2, n_layers=1, max_ctx=32)
    return _decode_model.DecodeGraphs(_decode_model.TinyDecoder(cfg, torch.device("cpu")), 0.2, 0.0)


def test_packed_buffer_writes_rows_and_fills_in_one_copy():
    graphs = _graphs()
    inputs = graphs.inputs
    values = {name: np.arange(3, dtype=inputs[name].numpy().dtype) + 1 for name in inputs.names}
    packed = _baselines.PackedPinnedBuffer(inputs, {name: fill for name, (_, fill) in graphs.fields.items()})
    packed.write(values, 3)
    for n in (3, 1):  # after a larger batch, the last field's rows beyond n are refilled too
        packed.write({name: v[:n] for name, v in values.items()}, n)
        for name, (dtype, fill) in graphs.fields.items():
            expected = torch.cat([torch.tensor(values[name][:n], dtype=dtype),
                                  torch.full((inputs.max_bs - n,), fill, dtype=dtype)])
            assert torch.equal(inputs[name], expected), (name, n)


def test_snapshot_restores_every_static_input():
    graphs = _graphs()
    inputs = graphs.inputs
    inputs.stage({name: [7, 8] for name in inputs.names}, 2)
    before = {name: inputs[name].clone() for name in inputs.names}
    snapshot = _decode_model.Snapshot(inputs)
    graphs.reset_inputs()
    assert not torch.equal(inputs["seq_lens"], before["seq_lens"])
    snapshot.restore()
    for name in inputs.names:
        assert torch.equal(inputs[name], before[name]), name
