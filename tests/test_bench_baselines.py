"""The benchmarks' own code, the one test module that imports bench/: the baselines compute what they
claim to (the engines' copy patterns give the builders' results, the decode loop's unguarded single
copy and its snapshots write the static inputs), every decode-loop backend and the ideals' replays
drive the same continuous batch to the same tokens (the benchmark asserts it; run small here), the
prep split times one backend's timed steps only, the prefill-copy benchmark's two ways give the same
tensors and rows, and the builders' table fits a terminal."""

import contextlib
import io
import json
import os
import random
import resource
import sys

import numpy as np
import pytest
import torch
from support import DEVICES, ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import _baseline_builders  # noqa: E402
import _baselines  # noqa: E402
import _decode_model  # noqa: E402
import _report  # noqa: E402
import builders  # noqa: E402
import decode_loop  # noqa: E402
import prefill_copy  # noqa: E402
import prep_split  # noqa: E402

from pinstage.builders import write_cache_indices  # noqa: E402


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


@pytest.mark.parametrize("device", DEVICES)
def test_the_engines_copies_give_the_list_builders_results(device):
    """bench/_baseline_builders.py: pinstage.builders' values copied "pinned" and "blocking" give
    what the builders stage in one copy."""
    calls = builders.builder_calls(random.Random(5), 9, device)
    for builder, methods in calls.items():
        if builder == "write_cache_indices":
            continue  # writes a table (below)
        expected = methods["list"]()
        for name in ("pinned", "blocking"):
            got = methods[name]()
            assert builders._same(expected, got), (builder, name)
    table, *args = builders.cache_batch(random.Random(5), 9, device)
    write_cache_indices(table, *args)
    expected = table.clone()
    assert expected.any()
    for copy in ("pinned", "blocking"):
        table.zero_()
        _baseline_builders.write_cache_indices(table, *args, copy)
        assert torch.equal(table.cpu(), expected.cpu()), copy


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
            expected = torch.cat(
                [torch.tensor(values[name][:n], dtype=dtype), torch.full((inputs.max_bs - n,), fill, dtype=dtype)]
            )
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


def test_builders_table_fits_in_120_columns():
    wide = {m: 12345.6 for m in builders.METHODS}
    rows = [
        dict(builder=b, bs=1024, us=dict(wide), spread={m: [0.5, 99999.0] for m in wide})
        for b in ("penalty_last_token_ids", "write_cache_indices", "logits")
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        builders.print_table(rows, repeats=15)
    lines = out.getvalue().splitlines()
    assert len(lines) > len(rows) + 2
    assert max(map(len, lines)) <= 120, max(lines, key=len)


@pytest.fixture
def one_thread():
    """The model's tensors are tiny: torch's intra-op threads only contend with the other test
    workers (ten times slower on a loaded two-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_loop():
    """A decode loop small enough for a test: a short context keeps max_new_tokens small, so that in
    12 steps about half the requests finish and others join."""
    return decode_loop.Config(
        batch_size=5,
        forward_ms=0.2,
        steps=12,
        warmup_steps=1,
        admit_every=2,
        vocab=256,
        d_model=32,
        n_heads=2,
        max_ctx=68,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_every_backend_generates_the_same_tokens(device, one_thread):
    """One round of every backend (the rounds' rotation is checked below)."""
    cfg = small_loop()
    dev = torch.device(device)
    cycles = decode_loop.GpuBusy().cycles_per_us if device == "cuda" else 0.0
    results = decode_loop.run_config(cfg, dev, cycles, repeats=1)  # raises if two backends' tokens differ
    assert set(results) == set(decode_loop.BACKENDS)
    for name, summary in results.items():
        assert [m["steps"] for m in summary["runs"]] == [cfg.steps], (name, summary)
        assert summary["tokens_per_s"] > 0 and summary["of_ideal"] > 0
        if name not in decode_loop.UNSAFE or device == "cpu":  # the unsafe baselines may race on the GPU only
            assert summary["requests_with_other_tokens"] == 0, name


def test_copy_floor_copies_what_each_staging_copies(one_thread, monkeypatch):
    """copy_floor's copy for each replayed staging: a decode step's recorded inputs into the graph's
    inputs (its tokens equal the others', test above), and for a prefill or the keep indices as many
    bytes as pinstage staged for them in the recording run."""
    cfg, dev = small_loop(), torch.device("cpu")
    specs = decode_loop.make_workload(cfg, 4 * cfg.batch_size + 8 * (cfg.warmup_steps + cfg.steps))
    model = _decode_model.TinyDecoder(cfg, dev)
    graphs = _decode_model.DecodeGraphs(model, cfg.forward_ms, 0.0)
    staged_bytes, stage_prefill, stage = [], decode_loop.stage_prefill, decode_loop.stage

    def prefill_counted(*args, **kwargs):
        staged, i = stage_prefill(*args, **kwargs)
        index_tensors = [i.sample_indices, i.input_logprob_indices, i.pruned_lens, i.pruned_row_indices]
        staged_bytes.append(sum(t.nbytes for t in [*staged, *index_tensors]))
        return staged, i

    def keep_counted(items, *args):
        staged = stage(items, *args)
        staged_bytes.append(sum(t.nbytes for t in staged))
        return staged

    monkeypatch.setattr(decode_loop, "stage_prefill", prefill_counted)
    monkeypatch.setattr(decode_loop, "stage", keep_counted)
    recorded = []
    decode_loop.run_backend(decode_loop.RECORDER, cfg, model, graphs, specs, record=recorded)
    replay = decode_loop.for_the_ideal(recorded)
    loop = decode_loop.Loop("copy_floor", cfg, model, graphs, specs, replay=replay)
    assert len(loop.floor.pairs) == len(replay)
    others = []
    for item, (dst, src) in zip(replay, loop.floor.pairs):
        assert dst.nbytes == src.nbytes and src.device.type == "cpu"
        if isinstance(item, _decode_model.Snapshot):
            assert dst is item.whole and torch.equal(src, item.saved)
        else:
            others.append(dst.nbytes)
    kinds = {type(item).__name__ for item in replay}
    assert others == staged_bytes and {"Snapshot", "PrefillInputs", "list"} <= kinds


def test_prep_split_times_the_timed_steps_of_its_backend_only(one_thread):
    """Each timed step writes the inputs once, and each admitting step calls every prefill builder
    once; the recording run (another backend) and the warm-up add nothing; the wrappers go away.
    Each call also has its thread CPU time, and each timed step its context switches."""
    cfg = small_loop()
    originals = (decode_loop.Loop.step, decode_loop.Loop.write_inputs, decode_loop.stage_prefill)
    samples, step_switches = prep_split.split(cfg, torch.device("cpu"), 0.0, "pinstage_static")
    assert (decode_loop.Loop.step, decode_loop.Loop.write_inputs, decode_loop.stage_prefill) == originals
    assert len(samples["write_inputs"]) == len(samples["stage_static"]) == cfg.steps
    admitting = len(samples["prefill_inputs"])
    assert 0 < admitting < cfg.steps
    for name in ("prefill_values", "prefill", *prep_split.BUILDERS):
        assert len(samples[name]) == admitting, name
    table = prep_split.rows(samples)
    assert [r["call"] for r in table][:3] == ["prefill_inputs", "prefill_values", "write_inputs"]
    assert all(r["median_us"] >= r["p10_us"] > 0 and r["cpu_median_us"] > 0 for r in table)
    # one (voluntary, involuntary) count per timed step where the OS counts them per thread
    assert len(step_switches) == (cfg.steps if hasattr(resource, "RUSAGE_THREAD") else 0)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_copy_compares_two_ways_that_give_the_same_items_and_rows(device, monkeypatch):
    prefill_copy.verify(prefill_copy.prefill(256, device), device)  # asserts items and rows
    monkeypatch.setattr(prefill_copy, "write_cache_indices", lambda *args: None)
    with pytest.raises(AssertionError, match="rows"):  # the second way writing no rows: the check fails
        prefill_copy.verify(prefill_copy.prefill(256, device), device)


def test_rounds_rotate_the_order():
    names = list("abcdef")
    orders = [decode_loop.rotated(names, i, 3) for i in range(3)]
    assert all(sorted(o) == names for o in orders)
    assert len({o[0] for o in orders}) == 3  # a different backend starts each round


def test_a_ratio_of_two_backends_pairs_their_rounds():
    """Rounds drifting up to 20% apart, a 2% gap in two of three: the paired ratio sees that gap,
    where a ratio of the medians would mix rounds (1.078 here)."""
    runs = {
        "a": {"runs": [{"tokens_per_s": v} for v in (98.0, 117.6, 107.8)]},
        "b": {"runs": [{"tokens_per_s": v} for v in (100.0, 120.0, 98.0)]},
    }
    assert decode_loop.paired_ratio(runs, "a", "b") == pytest.approx(0.98)


def test_workload_mixes_what_the_builders_must_handle():
    cfg = decode_loop.Config(batch_size=8, forward_ms=0.2)
    specs = decode_loop.make_workload(cfg, 200)
    assert {s.use_prefix for s in specs} == {True, False}
    assert any(s.logprob_start < len(s.prompt) for s in specs) and any(s.logprob_start == len(s.prompt) for s in specs)
    assert any(s.params.top_k == 1 for s in specs) and any(s.params.top_k > 1 for s in specs)
    assert any(s.params.repetition_penalty != 1 for s in specs)
    assert len({s.max_new_tokens for s in specs}) > 20
    assert all(cfg.prefix_len + len(s.prompt) + s.max_new_tokens < cfg.max_ctx for s in specs)


def test_the_decode_loop_keeps_the_configurations_it_finished(tmp_path, monkeypatch):
    """Its JSON is rewritten after every configuration, whole, so a run a time box stops keeps what it
    finished, marked incomplete."""
    done = []

    def run_config(cfg, dev, cycles, repeats, backends):
        done.append((cfg.batch_size, cfg.forward_ms))
        if len(done) == 2:
            raise KeyboardInterrupt  # the time box, during the second configuration
        return {"ideal": {"tokens_per_s": 1.0}}

    monkeypatch.setattr(decode_loop, "run_config", run_config)
    monkeypatch.setattr(decode_loop._timing, "pin_to_one_core", lambda: None)  # not this test process
    out = tmp_path / "decode_loop.json"
    with pytest.raises(KeyboardInterrupt):
        decode_loop.main(["--device", "cpu", "--batch-sizes", "1,8", "--forward-ms", "0.2", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["checks"] == []
    assert [(r["batch_size"], r["forward_ms"]) for r in report["results"]] == [(1, 0.2)]
    assert report["results"][0]["backends"] == {"ideal": {"tokens_per_s": 1.0}}
    assert sorted(os.listdir(tmp_path)) == ["decode_loop.json"], "no half-written file is left beside it"


def test_a_json_report_stopped_while_written_leaves_the_previous_one(tmp_path, monkeypatch):
    """A report is written whole or not at all: a write stopped half way leaves the previous file
    as it was and nothing beside it."""
    path = str(tmp_path / "report.json")
    _report.write_json(path, {"configurations": 1})

    def half_then_stop(report, f, **kwargs):
        f.write('{"configurations": ')
        raise KeyboardInterrupt  # a time box

    monkeypatch.setattr(_report.json, "dump", half_then_stop)
    with pytest.raises(KeyboardInterrupt):
        _report.write_json(path, {"configurations": 2})
    monkeypatch.undo()
    assert json.loads(open(path).read()) == {"configurations": 1}
    assert os.listdir(tmp_path) == ["report.json"]
