"""StaticInputs.write_rows: row writes kept until the next stage(), which applies them after the
fields' values (one copy, then one kernel on CUDA reading the writes from the same ring region).

Every expectation comes from a reference that applies the same steps with torch indexing on CPU
tensors (static_inputs_reference): stage() as in test_static_inputs, then each write as
`ref[name][row].view(-1)[start:start + len(values)] = torch.tensor(values, dtype=field.dtype)`.
"""

import numpy as np
import pytest
import torch
from gpu_busy import assert_still_busy, busy, captured
from staging_reference import assert_error_names, assert_views, expected, seeded_rng
from static_inputs_reference import maker, sync
from support import DEVICES

import pinstage
from pinstage import Field

ROW = 24  # block-table row width
FIELDS = {
    "input_ids": Field(torch.int64),
    "block_table": Field(torch.int32, (ROW,), fill=-1, persistent=True),
    "history": Field(torch.float32, (2, 5), fill=0.5, persistent=True),
    "slots": Field(torch.int32, (3,), fill=7),  # the last staged field: writes beyond n widen the copy
}
PERSISTENT = [name for name, f in FIELDS.items() if f.persistent]
make = maker(FIELDS)


def step_values(n, rng):
    return {
        "input_ids": [rng.randrange(-(1 << 40), 1 << 40) for _ in range(n)],
        "slots": np.array([[rng.randrange(1 << 20) for _ in range(3)] for _ in range(n)], dtype=np.int32),
    }


def random_writes(field, max_bs, k, rng, form):
    """k writes into `field`: random rows (some repeated), starts and ragged lengths (0-16 values)."""
    numel = int(np.prod(field.shape, dtype=np.int64))
    rows, starts, values = [], [], []
    for _ in range(k):
        length = rng.randint(0, min(16, numel))
        start = rng.randint(0, numel - length)
        row = rng.randrange(max_bs) if rows and rng.random() < 0.7 else (rows[-1] if rows else 0)
        if field.dtype.is_floating_point:
            v = [rng.choice([0.25, -1.5, 3.0, 1e3]) for _ in range(length)]
        else:
            v = [rng.randrange(-(1 << 30), 1 << 30) for _ in range(length)]
        rows.append(row)
        starts.append(start)
        values.append(
            v if form == "list" else np.array(v, dtype=np.float32 if field.dtype.is_floating_point else np.int64)
        )
    if form == "numpy":
        rows, starts = np.array(rows), np.array(starts)
    elif form == "tensor":
        rows, starts = torch.tensor(rows), torch.tensor(starts)
        values = [torch.tensor(v, dtype=field.dtype) for v in values]
    return rows, starts, values


# ---------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("device", DEVICES)
def test_construction_fills_persistent_fields(device):
    inputs, ref = make(device)
    sync(device)
    assert_views(inputs, ref.tensors, "after construction")
    assert inputs.pending_writes == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "numpy", "tensor"])
def test_row_writes_match_torch_indexing(device, form):
    """Random steps: staged values, then ragged writes (overlapping ones in the same row included)
    into both persistent fields and into a staged one; each step equals the reference."""
    inputs, ref = make(device)
    rng = seeded_rng("rows", form)
    for step in range(12):
        n = rng.randint(0, 16)
        for name in PERSISTENT + ["slots"]:
            for _ in range(rng.randint(0, 2)):  # several calls per field and step
                rows, starts, values = random_writes(FIELDS[name], 16, rng.choice([1, 8, 20]), rng, form)
                inputs.write_rows(name, rows, starts, values)
                ref.write_rows(name, rows, starts, values)
        values = step_values(n, rng)
        inputs.stage(values, n)
        ref.stage(values, n)
        assert inputs.pending_writes == 0
        sync(device)
        assert_views(inputs, ref.tensors, "step %d (n=%d, %s)" % (step, n, form))


@pytest.mark.parametrize("device", DEVICES)
def test_every_element_size_and_alignment(device):
    """Persistent fields of 1-, 2-, 4- and 8-byte elements, written at odd starts and lengths (the
    kernel copies each write with the widest unit its addresses and length allow)."""
    fields = {
        "flags": Field(torch.bool, (33,), fill=True, persistent=True),
        "bytes": Field(torch.uint8, (37,), fill=3, persistent=True),
        "half": Field(torch.bfloat16, (5,), fill=-2.5, persistent=True),
        "ids": Field(torch.int64, (9,), fill=-7, persistent=True),
        "probs": Field(torch.float64, (2, 3), fill=0.5, persistent=True),
    }
    inputs, ref = make(device, max_bs=8, fields=fields)
    rng = seeded_rng("element-sizes")
    for step in range(6):
        for name, f in fields.items():
            numel = int(np.prod(f.shape, dtype=np.int64))
            rows, starts, values = [], [], []
            for _ in range(rng.randint(1, 6)):
                length = rng.randint(0, numel)
                start = rng.randint(0, numel - length)
                if f.dtype == torch.bool:
                    v = [rng.random() < 0.5 for _ in range(length)]
                elif f.dtype.is_floating_point:
                    v = [rng.choice([0.25, -1.5, 3.0]) for _ in range(length)]
                else:
                    v = [rng.randrange(256) for _ in range(length)]
                rows.append(rng.randrange(8))
                starts.append(start)
                values.append(v)
            inputs.write_rows(name, rows, starts, values)
            ref.write_rows(name, rows, starts, values)
        inputs.stage({}, rng.randint(0, 8))
        ref.stage({}, 0)
        sync(device)
        assert_views(inputs, ref.tensors, "step %d" % step)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("longest", [16, 200])
def test_writes_into_distinct_rows_short_and_long(device, longest):
    """One write per row, as a block table's step is: on CUDA writes of up to 112 bytes travel as
    one record each, longer ones as a table of writes and their values."""
    fields = {"block_table": Field(torch.int32, (512,), fill=-1, persistent=True)}
    inputs, ref = make(device, max_bs=64, fields=fields)
    rng = seeded_rng("distinct", longest)
    for step in range(4):
        rows = rng.sample(range(64), rng.choice([1, 8, 64]))
        lengths = [rng.randint(1, longest) for _ in rows]
        starts = [rng.randint(0, 512 - n) for n in lengths]
        values = [[rng.randrange(1 << 30) for _ in range(n)] for n in lengths]
        inputs.write_rows("block_table", rows, starts, values)
        ref.write_rows("block_table", rows, starts, values)
        inputs.stage({}, 0)
        ref.stage({}, 0)
        sync(device)
        assert_views(inputs, ref.tensors, "step %d" % step)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_win_over_the_steps_values_and_later_writes_win(device):
    """A staged field takes its n rows of values and then the row writes over them; of two writes
    to the same elements the later call's lands; the stage after next rewrites the field whole."""
    inputs, ref = make(device)
    inputs.write_rows("slots", [1, 1], [0, 1], [[100, 101], [200]])
    inputs.write_rows("slots", [9], [2], [[300]])  # beyond n: the copy reaches row 9
    inputs.write_rows("block_table", [3, 3], [0, 2], [list(range(10, 14)), [77]])
    inputs.stage({"input_ids": [1, 2], "slots": [[1, 2, 3], [4, 5, 6]]}, 2)
    sync(device)
    assert inputs["slots"][:2].tolist() == [[1, 2, 3], [100, 200, 6]]
    assert inputs["slots"][9].tolist() == [7, 7, 300]
    assert inputs["block_table"][3][:5].tolist() == [10, 11, 77, 13, -1]
    inputs.stage({"input_ids": [5], "slots": [[8, 8, 8]]}, 1)
    sync(device)
    assert inputs["slots"].tolist() == [[8, 8, 8]] + [[7, 7, 7]] * 15, "row writes of a staged field outlived a step"
    assert inputs["block_table"][3][:5].tolist() == [10, 11, 77, 13, -1], "a persistent field lost its rows"


@pytest.mark.parametrize("device", DEVICES)
def test_only_persistent_fields(device):
    fields = {"bt": Field(torch.int32, (8,), persistent=True), "h": Field(torch.int64, (4,), fill=3, persistent=True)}
    inputs, ref = make(device, max_bs=4, fields=fields)
    for args in [("bt", [0, 3], [0, 5], [[1, 2], [9, 9, 9]]), ("h", [2], [1], [np.array([5, 6], np.int64)])]:
        inputs.write_rows(*args)
        ref.write_rows(*args)
    inputs.stage({}, 4)
    ref.stage({}, 4)
    sync(device)
    assert_views(inputs, ref.tensors, "only persistent fields")
    inputs.stage({}, 0)  # nothing pending: nothing changes
    sync(device)
    assert_views(inputs, ref.tensors, "an empty stage")


# ---------------------------------------------------------------------------------------------
# Errors: named, nothing kept, nothing staged


def pending_state(device):
    """Inputs after a good stage, with good writes pending, and their reference."""
    inputs, ref = make(device)
    rng = seeded_rng("pending")
    values = step_values(9, rng)
    inputs.stage(values, 9)
    ref.stage(values, 9)
    for name in PERSISTENT + ["slots"]:
        rows, starts, vals = random_writes(FIELDS[name], 16, 6, rng, "list")
        inputs.write_rows(name, rows, starts, vals)
        ref.write_rows(name, rows, starts, vals)
    return inputs, ref


def assert_pending_intact(inputs, ref, device, before):
    """The failed call kept nothing: the views are as they were and the next stage applies exactly
    the writes made before it."""
    assert inputs.pending_writes == before
    sync(device)
    want = {name: t.clone() for name, t in ref.tensors.items()}
    assert_views(inputs, want, "right after the error")
    values = step_values(4, seeded_rng("after"))
    inputs.stage(values, 4)
    ref.stage(values, 4)
    sync(device)
    assert_views(inputs, ref.tensors, "the stage after the error")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "args, exc_type, fragments",
    [
        (("top_p", [0], [0], [[1]]), ValueError, ["unknown field 'top_p'", "'block_table'"]),
        ((3, [0], [0], [[1]]), TypeError, ["str"]),
        (("block_table", [0, 16], [0, 0], [[1], [2]]), ValueError, ["field 'block_table'", "write 1", "row", "16"]),
        (("block_table", [-1], [0], [[1]]), ValueError, ["write 0", "row", "-1"]),
        (("block_table", [2], [25], [[1]]), ValueError, ["write 0", "start", "25"]),
        (("block_table", [2, 3], [0, 20], [[1], [1, 2, 3, 4, 5]]), ValueError, ["write 1", "run past", "24"]),
        (("history", [2], [8], [[1.0, 2.0, 3.0]]), ValueError, ["field 'history'", "run past", "10"]),
        (("block_table", [1.0], [0], [[1]]), TypeError, ["row must be an int", "float"]),
        (("block_table", [True], [0], [[1]]), TypeError, ["row must be an int", "bool"]),
        (("block_table", [0], [0], [5]), ValueError, ["write 0", "1-D"]),
        (("block_table", [0], [0], [[[1, 2]]]), ValueError, ["write 0", "1-D"]),
        (("block_table", [0, 1], [0], [[1], [2]]), ValueError, ["one entry per write", "2, 1 and 2"]),
        (("block_table", 5, [0], [[1]]), TypeError, ["rows must be a sequence"]),
        (("slots", [0], [0], "abc"), TypeError, ["values must be a sequence"]),
    ],
)
def test_bad_write_names_it_and_keeps_nothing(device, args, exc_type, fragments):
    inputs, ref = pending_state(device)
    before = inputs.pending_writes
    with pytest.raises(exc_type) as err:
        inputs.write_rows(*args)
    missing = [f for f in fragments if f not in str(err.value)]
    assert not missing, "%r lacks %r" % (str(err.value), missing)
    assert_pending_intact(inputs, ref, device, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "name, bad",
    [("block_table", 2**40), ("block_table", "7"), ("block_table", None), ("history", "x"), ("slots", 2**31)],
)
def test_bad_value_names_field_write_index_value_and_dtype(device, name, bad):
    """The exception torch.tensor raises for the write's values, naming the field, the write, the
    element's index, the value and the dtype; the writes before it in the same call are dropped too."""
    inputs, ref = pending_state(device)
    before = inputs.pending_writes
    good = [1.0, 2.0] if FIELDS[name].dtype.is_floating_point else [1, 2]
    bad_values = good + [bad]
    _, want = expected(bad_values, FIELDS[name].dtype)
    assert want is not None, "torch.tensor accepts %r" % (bad,)
    with pytest.raises(type(want)) as err:
        inputs.write_rows(name, [0, 1], [0, 0], [good, bad_values])
    assert "field '%s'" % name in str(err.value) and "write 1" in str(err.value), str(err.value)
    assert_error_names(err.value, (2,), bad, FIELDS[name].dtype)
    assert_pending_intact(inputs, ref, device, before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_stage_stages_nothing_and_keeps_the_writes(device):
    inputs, ref = pending_state(device)
    before = inputs.pending_writes
    values = step_values(4, seeded_rng("bad-stage"))
    values["input_ids"][2] = 2**63
    _, want = expected(values["input_ids"], torch.int64)
    with pytest.raises(type(want), match="field 'input_ids'"):
        inputs.stage(values, 4)
    with pytest.raises(ValueError, match="field 'block_table' is persistent"):
        inputs.stage(dict(step_values(4, seeded_rng("x")), block_table=[[0] * ROW] * 4), 4)
    assert_pending_intact(inputs, ref, device, before)


# ---------------------------------------------------------------------------------------------
# Re-entrancy: Python code run by a conversion


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["row", "start", "value"])
def test_write_rows_entered_from_its_own_conversion_raises_and_keeps_nothing(device, where):
    """An __index__ that writes (or stages) the same inputs again, from a row, a start or a value:
    the inner call raises, the outer one fails naming its field and write, and neither keeps
    anything; the inputs work normally afterwards."""
    inputs, ref = pending_state(device)
    before = inputs.pending_writes

    class Reenters:
        calls = 0

        def __index__(self):
            Reenters.calls += 1
            if Reenters.calls == 1:
                inputs.write_rows("block_table", [0], [0], [[5]])
            else:
                inputs.stage(step_values(1, seeded_rng("inner")), 1)
            return 1

    for _ in range(2):  # the first time write_rows inside, the second stage()
        rows, starts, values = {
            "row": ([Reenters()], [0], [[1]]),
            "start": ([0], [Reenters()], [[1]]),
            "value": ([0], [0], [[1, Reenters()]]),
        }[where]
        with pytest.raises(RuntimeError, match="already being staged") as err:
            inputs.write_rows("block_table", [3] + list(rows), [0] + list(starts), [[9]] + list(values))
        assert "field 'block_table'" in str(err.value) and "write 1" in str(err.value), str(err.value)
    assert_pending_intact(inputs, ref, device, before)


@pytest.mark.parametrize("device", DEVICES)
def test_write_rows_entered_from_a_stage_conversion_raises_and_stages_nothing(device):
    inputs, ref = pending_state(device)
    before = inputs.pending_writes

    class WritesRows:
        def __index__(self):
            inputs.write_rows("block_table", [0], [0], [[5]])
            return 1

    values = step_values(4, seeded_rng("outer"))
    values["input_ids"] = [WritesRows()] + values["input_ids"][1:]
    with pytest.raises(RuntimeError, match="already being staged") as err:
        inputs.stage(values, 4)
    assert "input_ids" in str(err.value)
    assert_pending_intact(inputs, ref, device, before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_conversion_that_stages_elsewhere_or_edits_the_arguments_changes_nothing_written(device):
    """An __index__ may use pinstage otherwise and may change the caller's lists: the writes are
    those of the arguments as they were when write_rows took them, written in full."""
    inputs, ref = pending_state(device)
    rows, starts = [4, 5], [0, 3]
    values = [[1, 2], None]

    class Meddles:
        def __index__(self):
            other = pinstage.stage_to_device([1, 2, 3], torch.int64, device=device)
            assert other.cpu().tolist() == [1, 2, 3]
            rows[:] = [0]
            starts.append(99)
            values[0].append(1000)
            return 6

    values[1] = [Meddles(), 7]
    inputs.write_rows("block_table", rows, starts, values)
    ref.write_rows("block_table", [4, 5], [0, 3], [[1, 2], [6, 7]])
    values = step_values(3, seeded_rng("meddle"))
    inputs.stage(values, 3)
    ref.stage(values, 3)
    sync(device)
    assert_views(inputs, ref.tensors, "after a meddling conversion")


# ---------------------------------------------------------------------------------------------
# CUDA: capture, busy streams, one copy


@pytest.mark.cuda
def test_stage_with_writes_during_capture_is_refused_and_keeps_them(cuda_ring):
    inputs, ref = pending_state("cuda")
    before = inputs.pending_writes
    values = step_values(4, seeded_rng("capture"))
    torch.cuda.synchronize()
    stats = pinstage.stats()
    graph = torch.cuda.CUDAGraph()
    capture_stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=capture_stream):
        y = inputs["block_table"] + 1
        with pytest.raises(RuntimeError, match="(?i)captur"):
            inputs.stage(values, 4)
        with pytest.raises(RuntimeError, match="(?i)captur"):
            inputs.stage(values, 4, stream=capture_stream)
    graph.replay()
    torch.cuda.synchronize()
    assert pinstage.stats()["copies"] == stats["copies"], "a refused stage enqueued a copy"
    assert torch.equal(y.cpu(), ref.tensors["block_table"] + 1), "the capture was disturbed"
    assert_pending_intact(inputs, ref, "cuda", before)


@pytest.mark.cuda
@pytest.mark.parametrize("on_full", ["overflow", "wait"])
def test_eight_steps_of_writes_behind_a_busy_stream(cuda_ring, on_full):
    """8 stages with row writes queued behind a sleeping kernel, through a ring of about two steps:
    a region reused before its kernel read it shows up as a wrong row in the snapshots."""
    max_bs = 256
    fields = {"input_ids": Field(torch.int64), "block_table": Field(torch.int32, (512,), persistent=True)}
    inputs, ref = make("cuda", max_bs=max_bs, fields=fields)
    rng = seeded_rng("race", on_full)
    pinstage.configure(ring_bytes=16 << 10, on_full=on_full)
    torch.cuda.synchronize()
    snapshots, want = [], []
    done = busy(200 if on_full == "overflow" else 20)
    for step in range(8):
        n = 64
        rows = rng.sample(range(max_bs), 64)
        starts = [rng.randrange(0, 496) for _ in rows]
        values = [[rng.randrange(1 << 30) for _ in range(rng.randint(1, 16))] for _ in rows]
        inputs.write_rows("block_table", rows, starts, values)
        ref.write_rows("block_table", rows, starts, values)
        ids = list(range(step, step + n))
        inputs.stage({"input_ids": ids}, n)
        ref.stage({"input_ids": ids}, n)
        snapshots.append(inputs["block_table"].clone())
        want.append(ref.tensors["block_table"].clone())
    if on_full == "overflow":
        assert_still_busy(done, "the stages were queued")
    torch.cuda.synchronize()
    wrong = [int((got.cpu() != exp).sum()) for got, exp in zip(snapshots, want)]
    assert wrong == [0] * 8, "wrong values per step: %s" % wrong


@pytest.mark.cuda
def test_one_copy_per_stage_with_writes(cuda_ring):
    inputs, _ = make("cuda", max_bs=64)
    rng = seeded_rng("one-copy")
    torch.cuda.synchronize()
    for k in [1, 8, 64]:
        rows, starts, values = random_writes(FIELDS["block_table"], 64, k, rng, "list")
        inputs.write_rows("block_table", rows, starts, values)
        before = pinstage.stats()
        inputs.stage(step_values(5, rng), 5)
        after = pinstage.stats()
        assert after["copies"] - before["copies"] == 1, "k=%d: %d copies" % (k, after["copies"] - before["copies"])


@pytest.mark.cuda
def test_writes_on_a_side_stream_are_seen_by_that_stream(cuda_ring):
    inputs, ref = make("cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    done = busy(50, side)
    inputs.write_rows("block_table", [2, 15], [0, 20], [[1, 2, 3], [4, 5, 6, 7]])
    ref.write_rows("block_table", [2, 15], [0, 20], [[1, 2, 3], [4, 5, 6, 7]])
    values = step_values(3, seeded_rng("side"))
    inputs.stage(values, 3, stream=side)
    ref.stage(values, 3)
    with torch.cuda.stream(side):
        seen = inputs["block_table"].clone()
    assert_still_busy(done, "the stage returned")
    side.synchronize()
    assert torch.equal(seen.cpu(), ref.tensors["block_table"])
    assert_views(inputs, ref.tensors, "a stage with writes on a side stream")


@pytest.mark.parametrize("device", DEVICES)
def test_batch_state_stages_around_a_persistent_block_table(device):
    """BatchState.stage_static gives values for the staged fields only (staged_names); the block
    table keeps its rows and takes the pending writes in the same stage."""
    from pinstage.builders import BatchState, Request, SamplingParams, batch_static_inputs

    extra = {"positions": Field(torch.int64), "block_table": Field(torch.int32, (6,), fill=-1, persistent=True)}
    inputs = batch_static_inputs(4, extra, device=device)
    assert "block_table" in inputs.names and "block_table" not in inputs.staged_names
    state = BatchState()
    for i in range(3):
        state.add(Request(origin_input_ids=[1, 2, i], req_pool_idx=i, sampling_params=SamplingParams()))
    inputs.write_rows("block_table", [0, 2], [0, 1], [[10, 11], [20]])
    state.stage_static(inputs, {"positions": [3, 3, 3]})
    inputs.write_rows("block_table", [2], [2], [[21, 22]])
    state.stage_static(inputs, {"positions": [4, 4, 4]})
    sync(device)
    assert inputs["positions"].tolist() == [4, 4, 4, 0]
    assert inputs["block_table"].tolist() == [
        [10, 11, -1, -1, -1, -1],
        [-1] * 6,
        [-1, 20, 21, 22, -1, -1],
        [-1] * 6,
    ]


@pytest.mark.cuda
def test_a_graph_replayed_after_each_stage_reads_the_rows_written(cuda_ring):
    """A graph captured once on the views, replayed after each stage behind a busy stream: each
    replay sees that step's values and every row write so far (the kernel runs before it)."""
    inputs, ref = make("cuda", max_bs=32)
    weights = torch.arange(ROW, dtype=torch.int64, device="cuda")

    def step():
        return (inputs["block_table"].long() * weights).sum(1) + inputs["input_ids"]

    graph, out = captured(step)
    rng = seeded_rng("graph")
    steps = []
    for _ in range(8):
        n = rng.randint(0, 32)
        steps.append((random_writes(FIELDS["block_table"], 32, 8, rng, "list"), n, step_values(n, rng)))
    results, expected_out = [], []
    weights_cpu = weights.cpu()  # read before the busy window: a device-to-host copy waits for it
    done = busy(300)
    for (rows, starts, values), n, step_vals in steps:
        inputs.write_rows("block_table", rows, starts, values)
        ref.write_rows("block_table", rows, starts, values)
        values = step_vals
        inputs.stage(values, n)
        ref.stage(values, n)
        graph.replay()
        results.append(out.clone())
        expected_out.append((ref.tensors["block_table"].long() * weights_cpu).sum(1) + ref.tensors["input_ids"])
    assert_still_busy(done, "the stages and replays were queued")
    torch.cuda.synchronize()
    for k, (got, want) in enumerate(zip(results, expected_out)):
        assert torch.equal(got.cpu(), want), "replay %d" % k


NAMES = "(the fields are 'input_ids', 'block_table', 'history', 'slots')"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "call, exc_type, message",
    [
        (("stage", 17), ValueError, "pinstage.StaticInputs.stage: n must be between 0 and max_bs=16, got 17"),
        (
            ("stage", 2**70),
            ValueError,
            "pinstage.StaticInputs.stage: n must be between 0 and max_bs=16, got %d" % 2**70,
        ),
        (("stage", 1.0), TypeError, "pinstage.StaticInputs.stage: n must be an int, got float"),
        (("stage", True), TypeError, "pinstage.StaticInputs.stage: n must be an int, got bool"),
        (("stage", 4, "top_p"), ValueError, "pinstage.StaticInputs.stage: unknown field 'top_p' " + NAMES),
        (("stage", 4, 3), ValueError, "pinstage.StaticInputs.stage: unknown field 3 " + NAMES),
        (
            ("stage", 4, "history"),
            ValueError,
            "pinstage.StaticInputs.stage: field 'history' is persistent: stage() takes no values for it; "
            "change its rows with write_rows()",
        ),
        (
            ("write_rows", "top_p", [0], [0]),
            ValueError,
            "pinstage.StaticInputs.write_rows: unknown field 'top_p' " + NAMES,
        ),
        (
            ("write_rows", "block_table", [16], [0]),
            ValueError,
            "pinstage.StaticInputs.write_rows: field 'block_table': write 0: row must be between 0 and 15, got 16",
        ),
        (
            ("write_rows", "block_table", [1], [25]),
            ValueError,
            "pinstage.StaticInputs.write_rows: field 'block_table': write 0: start must be between 0 and 24, got 25",
        ),
        (
            ("write_rows", "block_table", [1.5], [0]),
            TypeError,
            "pinstage.StaticInputs.write_rows: field 'block_table': write 0: row must be an int, got float",
        ),
        (
            ("write_rows", "history", [0], [False]),
            TypeError,
            "pinstage.StaticInputs.write_rows: field 'history': write 0: start must be an int, got bool",
        ),
    ],
)
def test_argument_and_field_errors_read_exactly(device, call, exc_type, message):
    """stage()'s n and write_rows' row and start are checked by one function, and both calls look
    fields up by one: each error's whole text, as the callers of either have always read it."""
    inputs, ref = pending_state(device)
    before = inputs.pending_writes
    with pytest.raises(exc_type) as err:
        if call[0] == "stage":
            values = step_values(4, seeded_rng("exact"))
            if len(call) > 2:
                values[call[2]] = [1]
            inputs.stage(values, call[1])
        else:
            inputs.write_rows(call[1], call[2], call[3], [[1]])
    assert str(err.value) == message
    assert_pending_intact(inputs, ref, device, before)
