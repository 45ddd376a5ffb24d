"""pinstage.StaticInputs: a CUDA graph's static inputs in one allocation, filled by one copy per step.

Every expectation comes from a reference kept beside the inputs: per field, rows [0, n) are
torch.tensor(values, dtype=field.dtype) and rows [n, max_bs) the field's fill (torch.full). The
tests parametrized over the device run on the CPU everywhere and on CUDA where a GPU is visible; the
CUDA-only tests keep the stream busy with torch.cuda._sleep so that a ring region reused before its
copy ran, or a host wait, shows up as a wrong value or a finished sleep.
"""

import numpy as np
import pytest
import torch
from gpu_busy import assert_still_busy, busy, captured
from staging_reference import assert_error_names, assert_same_tensor, assert_views, natural_values, seeded_rng
from static_inputs_reference import maker, sync
from support import DEVICES

import pinstage
from pinstage import Field, StaticInputs

# One engine step's graph inputs; the last field has a fill other than 0 (the rows a shrinking n
# leaves behind must get it back) and the widest rows.
FIELDS = {
    "input_ids": Field(torch.int64),
    "positions": Field(torch.int32),
    "top_ks": Field(torch.int32, fill=1 << 30),
    "greedy": Field(torch.bool, fill=True),
    "half": Field(torch.bfloat16, (3,), fill=-2.5),
    "seeds": Field(torch.uint64, fill=42),
    "temperatures": Field(torch.float32, (1,), fill=1.0),
    "penalties": Field(torch.float64, (2, 3), fill=0.5),
}
make = maker(FIELDS)


def field_values(f, n, rng, form):
    """n rows of natural values for field f, as a list, a numpy array or a CPU tensor."""
    flat = natural_values(f.dtype, n * int(np.prod(f.shape, dtype=np.int64)), rng)
    if f.dtype in (torch.float64, torch.float32, torch.bfloat16):
        flat = [v if abs(v) < 1e30 else 1.0 for v in flat]  # inf/overflow is the converter tests' business
    rows = torch.tensor(flat, dtype=f.dtype).reshape((n,) + f.shape)
    if form == "tensor":
        return rows
    if form == "numpy" and f.dtype != torch.bfloat16:
        return rows.numpy()
    return rows.tolist() if f.shape else flat


def step_values(fields, n, rng, forms=("list", "numpy", "tensor")):
    return {name: field_values(f, n, rng, forms[i % len(forms)]) for i, (name, f) in enumerate(fields.items())}


# ---------------------------------------------------------------------------------------------
# Layout and values


@pytest.mark.parametrize("device", DEVICES)
def test_fields_are_aligned_views_of_one_allocation(device):
    inputs, ref = make(device)
    assert inputs.names == tuple(FIELDS) and inputs.max_bs == 16
    assert inputs.device.type == device
    storages = {inputs[name].untyped_storage().data_ptr() for name in inputs.names}
    assert len(storages) == 1, "the fields are %d allocations, not one" % len(storages)
    spans = []
    for name, f in FIELDS.items():
        view = inputs[name]
        assert view.dtype == f.dtype and tuple(view.shape) == (16,) + f.shape and view.is_contiguous(), name
        assert view.data_ptr() % 16 == 0, "field %s is not 16-byte aligned" % name
        spans.append((view.data_ptr(), view.data_ptr() + view.nbytes))
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), "fields overlap"
    sync(device)
    assert_views(inputs, ref.tensors, "after construction (every row at its fill)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 7, 16])
def test_stage_gives_torch_tensor_values_and_fill(device, n):
    inputs, ref = make(device)
    values = step_values(FIELDS, n, seeded_rng("values", n))
    inputs.stage(values, n)
    ref.stage(values, n)
    sync(device)
    assert_views(inputs, ref.tensors, "n=%d" % n)


@pytest.mark.parametrize("device", DEVICES)
def test_shrinking_n_refills_rows(device):
    """Rows a larger n wrote must hold the fill again after a smaller n, in every field (the last
    field's rows beyond the copy's end are the ones a copy sized by n alone would leave stale)."""
    inputs, ref = make(device)
    rng = seeded_rng("shrink")
    for step, n in enumerate([16, 3, 0, 12, 12, 5, 16, 1, 9, 2]):
        values = step_values(FIELDS, n, rng)
        inputs.stage(values, n)
        ref.stage(values, n)
        sync(device)
        assert_views(inputs, ref.tensors, "step %d, n=%d" % (step, n))


@pytest.mark.parametrize("device", DEVICES)
def test_one_field_and_empty_rows(device):
    fields = {"ids": Field(torch.int64, fill=-1)}
    inputs, ref = make(device, max_bs=5, fields=fields)
    for n in [5, 2, 0, 4]:
        values = {"ids": list(range(10, 10 + n))}
        inputs.stage(values, n)
        ref.stage(values, n)
        sync(device)
        assert_views(inputs, ref.tensors, "n=%d" % n)
    empty = {"none": Field(torch.float32, (0,)), "ids": Field(torch.int64)}
    inputs, ref = make(device, max_bs=4, fields=empty)
    inputs.stage({"none": [], "ids": [1, 2]}, 2)
    ref.stage({"none": [], "ids": [1, 2]}, 2)
    sync(device)
    assert_views(inputs, ref.tensors, "a field of zero-size rows")


@pytest.mark.parametrize("device", DEVICES)
def test_values_through_the_fallback_and_any_shape_of_n_rows(device):
    """Values the fast paths decline (numpy scalars in a list) are converted as torch.tensor does; a
    field of shape (1,) takes a flat list of n values, as stage_into takes any shape of its size."""
    fields = {"ids": Field(torch.int64), "temperatures": Field(torch.float32, (1,), fill=1.0)}
    inputs, ref = make(device, max_bs=4, fields=fields)
    values = {"ids": [np.int64(5), np.int32(-7), 3], "temperatures": [0.5, 0.25, 2.0]}
    inputs.stage(values, 3)
    ref.stage(values, 3)
    sync(device)
    assert_views(inputs, ref.tensors, "fallback values")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "numpy"])
def test_a_later_fields_python_code_cannot_change_an_earlier_field(device, form):
    """Field 'ids' is planned first; converting 'temperatures' runs an element's __index__ that
    rewrites the ids' source: ids are staged as they were when taken, as torch.tensor field by
    field gives them, never the bytes written later."""
    fields = {"ids": Field(torch.int64), "ks": Field(torch.int32)}
    inputs, _ = make(device, max_bs=4, fields=fields)
    ids = [1, 2, 3] if form == "list" else np.array([1, 2, 3], dtype=np.int64)

    class Rewrites:
        def __index__(self):
            ids[0] = 99
            return 5

    inputs.stage({"ids": ids, "ks": [Rewrites(), 6, 7]}, 3)
    sync(device)
    assert inputs["ids"].tolist() == [1, 2, 3, 0]
    assert inputs["ks"].tolist() == [5, 6, 7, 0]


# ---------------------------------------------------------------------------------------------
# Errors: named, and nothing staged


def staged_state(device):
    """Inputs after one good stage, with their reference."""
    inputs, ref = make(device)
    values = step_values(FIELDS, 9, seeded_rng("before-error"))
    inputs.stage(values, 9)
    ref.stage(values, 9)
    return inputs, ref


def assert_nothing_staged(inputs, ref, device, what):
    sync(device)
    assert_views(inputs, ref.tensors, "after %s" % what)
    values = step_values(FIELDS, 4, seeded_rng("after-error"))
    inputs.stage(values, 4)
    ref.stage(values, 4)
    sync(device)
    assert_views(inputs, ref.tensors, "a stage after %s" % what)


@pytest.mark.parametrize("device", DEVICES)
def test_a_stage_entered_from_a_conversion_raises_and_stages_nothing(device):
    """An element's __index__ that stages the same inputs again would move the dirty-row mark under
    the outer copy: the inner call raises, the outer one fails naming its field, nothing is staged
    by either, and the inputs stage normally afterwards."""
    inputs, ref = staged_state(device)
    inner = step_values(FIELDS, 2, seeded_rng("inner"))

    class StagesAgain:
        def __index__(self):
            inputs.stage(inner, 2)
            return 1

    values = step_values(FIELDS, 4, seeded_rng("outer"))
    values["top_ks"] = [StagesAgain()] + list(values["top_ks"][1:])
    with pytest.raises(RuntimeError, match="already being staged") as err:
        inputs.stage(values, 4)
    assert "top_ks" in str(err.value)
    assert_nothing_staged(inputs, ref, device, "a re-entered stage")


@pytest.mark.parametrize("device", DEVICES)
def test_missing_and_unknown_fields(device):
    inputs, ref = staged_state(device)
    values = step_values(FIELDS, 4, seeded_rng("missing"))
    del values["temperatures"]
    with pytest.raises(KeyError, match="temperatures"):
        inputs.stage(values, 4)
    values = step_values(FIELDS, 4, seeded_rng("unknown"))
    values["top_p"] = [0.5] * 4
    with pytest.raises(ValueError, match="top_p"):
        inputs.stage(values, 4)
    with pytest.raises(TypeError, match="dict"):
        inputs.stage(list(values.items()), 4)
    assert_nothing_staged(inputs, ref, device, "missing and unknown fields")


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_row_count_names_the_field(device):
    inputs, ref = staged_state(device)
    values = step_values(FIELDS, 4, seeded_rng("rows"))
    values["penalties"] = values["penalties"][:3]  # 3 rows of (2, 3) for n=4
    with pytest.raises(ValueError, match="field 'penalties'.*n=4") as err:
        inputs.stage(values, 4)
    assert "[3, 2, 3]" in str(err.value), "the message does not show the data's shape: %s" % err.value
    assert_nothing_staged(inputs, ref, device, "a wrong row count")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "field, bad",
    [
        ("input_ids", 2**63),  # beyond int64
        ("positions", 2**40),  # beyond int32
        ("top_ks", "7"),  # a str element
        ("penalties", None),  # None in a float64 row
    ],
)
def test_bad_value_names_field_index_value_and_dtype(device, field, bad):
    """The exception type torch.tensor raises for the field's values, naming the field, the element's
    index, its value and the dtype."""
    inputs, ref = staged_state(device)
    values = step_values(FIELDS, 4, seeded_rng("bad", field), forms=("list",))
    rows = values[field]
    if FIELDS[field].shape:
        rows[2][1][0] = bad
        index = (2, 1, 0)
    else:
        rows[2] = bad
        index = (2,)
    exc_type = None
    try:
        torch.tensor(rows, dtype=FIELDS[field].dtype)
    except Exception as exc:  # noqa: BLE001 - the exception type is the expectation
        exc_type = type(exc)
    assert exc_type is not None, "torch.tensor accepts %r as %s" % (bad, FIELDS[field].dtype)
    with pytest.raises(exc_type) as err:
        inputs.stage(values, 4)
    assert "field '%s'" % field in str(err.value), str(err.value)
    assert_error_names(err.value, index, bad, FIELDS[field].dtype)
    assert_nothing_staged(inputs, ref, device, "a bad value in %s" % field)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_n(device):
    inputs, ref = staged_state(device)
    values = step_values(FIELDS, 4, seeded_rng("n"))
    for n, exc_type in [(17, ValueError), (-1, ValueError), (4.0, TypeError), (True, TypeError), (2**70, ValueError)]:
        with pytest.raises(exc_type, match="n"):
            inputs.stage(values, n)
    inputs.stage(values, np.int64(4))  # operator.index
    ref.stage(values, 4)
    sync(device)
    assert_views(inputs, ref.tensors, "n as a numpy int")


def test_field_declarations_are_checked():
    with pytest.raises(RuntimeError, match="field 'k'"):
        StaticInputs({"k": Field(torch.int32, fill=1 << 40)}, max_bs=4, device="cpu")
    with pytest.raises(TypeError, match="complex64"):
        StaticInputs({"c": Field(torch.complex64)}, max_bs=4, device="cpu")
    with pytest.raises(TypeError, match="field 'x'"):
        StaticInputs({"x": (torch.int64, ())}, max_bs=4, device="cpu")
    with pytest.raises(ValueError, match="field 'x'"):
        StaticInputs({"x": Field(torch.int64, (2, -1))}, max_bs=4, device="cpu")
    with pytest.raises(ValueError, match="max_bs"):
        StaticInputs({"x": Field(torch.int64)}, max_bs=0, device="cpu")
    with pytest.raises(ValueError, match="field"):
        StaticInputs({}, max_bs=4, device="cpu")


def test_declarations_out_of_range_or_not_text_name_the_problem():
    """These once came back as pybind11's "incompatible constructor arguments" or "Unable to cast
    ... to C++ type '?'"."""
    with pytest.raises(ValueError, match=r"max_bs must be between 1 and 2\*\*63 - 1, got 9223372036854775808"):
        StaticInputs({"x": Field(torch.int64)}, max_bs=2**63, device="cpu")
    with pytest.raises(ValueError, match=r"field 'x': shape \(2, 9223372036854775808\): each dimension must be"):
        StaticInputs({"x": Field(torch.int64, (2, 2**63))}, max_bs=4, device="cpu")
    with pytest.raises(ValueError, match=r"field name 'a\\ud800' is not valid text"):
        StaticInputs({"a\ud800": Field(torch.int64)}, max_bs=4, device="cpu")
    with pytest.raises(RuntimeError, match="more than 2\\*\\*63 bytes|Storage size calculation overflowed"):
        StaticInputs({"x": Field(torch.int64, (2**61,))}, max_bs=4, device="cpu")
    with pytest.raises(ValueError, match=r"field name 'a\\x00b' holds a NUL character"):
        StaticInputs({"a\x00b": Field(torch.int64)}, max_bs=4, device="cpu")  # messages would end at the NUL
    with pytest.raises(
        RuntimeError, match=r"^pinstage.StaticInputs: field 'table': Storage size calculation overflowed"
    ):
        StaticInputs({"ok": Field(torch.int8), "table": Field(torch.int32, (2**62,))}, max_bs=4, device="cpu")
    with pytest.raises(
        RuntimeError, match=r"^pinstage.StaticInputs: field 'table': Storage size calculation overflowed"
    ):
        StaticInputs({"ok": Field(torch.int8), "table": Field(torch.int64, (2**31,))}, max_bs=2**33, device="cpu")


@pytest.mark.parametrize("fill", [2**64, -(2**64), 2**1024])
def test_a_fill_beyond_its_dtype_names_the_field(fill):
    """torch.full's OverflowError, as for any fill the dtype cannot hold, with the field named."""
    dtype = torch.float32 if fill == 2**1024 else torch.int64
    with pytest.raises(OverflowError, match=rf"^pinstage.StaticInputs: field 'x': fill {fill}: "):
        StaticInputs({"x": Field(dtype, fill=fill)}, max_bs=4, device="cpu")


def test_field_refuses_a_dtype_at_construction():
    """Field(np.int64) was accepted until a StaticInputs was built from it."""
    with pytest.raises(
        TypeError,
        match=r"Field dtype must be a torch.dtype, got numpy.int64 \(a numpy type\); "
        r"use torch.int64",
    ):
        Field(np.int64)
    with pytest.raises(TypeError, match="unsupported dtype torch.complex64"):
        Field(torch.complex64, fill=0)
    with pytest.raises(TypeError, match=r"field 'x' dtype must be a torch.dtype"):
        StaticInputs({"x": Field(torch.int64)._replace(dtype=np.int64)}, max_bs=4, device="cpu")


class default_device:
    """torch's default device set to `device` by `with torch.device(...)` or set_default_device."""

    def __init__(self, device, how):
        self.device, self.how = device, how

    def __enter__(self):
        if self.how == "with":
            self.context = torch.device(self.device)
            self.context.__enter__()
        else:
            torch.set_default_device(self.device)

    def __exit__(self, *exc):
        if self.how == "with":
            self.context.__exit__(*exc)
        else:
            torch.set_default_device(None)


@pytest.mark.parametrize("how", ["with", "set_default_device"])
@pytest.mark.parametrize("device", DEVICES)
def test_the_default_device_chooses_neither_the_fills_nor_the_device(device, how):
    """SGLang allocates its graph inputs inside `with torch.device(device):`, where fill=5 once
    raised "fill must be one CPU value of its dtype" (the fill was made on the default device). The
    fills are host values whatever the default device; the inputs' device is stage_to_device's rule
    (None: the current CUDA device). On the CPU, "meta" stands in for a device that is not the CPU."""
    from pinstage.builders import batch_static_inputs

    fields = {
        "a": Field(torch.int64, fill=5),
        "b": Field(torch.bool, (2,), fill=True),
        "c": Field(torch.bfloat16, fill=-2.5),
    }
    default = "meta" if device == "cpu" else "cuda"
    arg = "cpu" if device == "cpu" else None
    with default_device(default, how):
        inputs = StaticInputs(fields, max_bs=3, device=arg)
        batch = batch_static_inputs(2, device=arg)
        inputs.stage({"a": [1], "b": [[False, True]], "c": np.array([1.5], np.float32)}, 1)
    want = torch.device("cpu") if device == "cpu" else torch.device("cuda", torch.cuda.current_device())
    assert inputs.device == want and inputs["a"].device == want and batch["seq_lens"].device == want
    sync(device)
    assert inputs["a"].cpu().tolist() == [1, 5, 5]
    assert inputs["b"].cpu().tolist() == [[False, True], [True, True], [True, True]]
    assert inputs["c"].cpu().tolist() == [1.5, -2.5, -2.5]
    assert batch["seq_lens"].cpu().tolist() == [1, 1] and batch["top_ps"].cpu().tolist() == [1.0, 1.0]


def test_cpu_inputs_take_no_stream():
    inputs, _ = make("cpu")
    with pytest.raises(ValueError, match="stream"):
        inputs.stage(step_values(FIELDS, 1, seeded_rng("stream")), 1, stream=object())


# ---------------------------------------------------------------------------------------------
# CUDA: one copy, the ring's rules, graphs, no waits


def allocation(inputs):
    """The inputs' one allocation as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=inputs.device).set_(inputs[inputs.names[0]].untyped_storage())


def field_of(inputs, flat, name):
    """Field `name` of a copy `flat` of the allocation."""
    view = inputs[name]
    start = view.data_ptr() - allocation(inputs).data_ptr()
    return flat[start : start + view.nbytes].view(view.dtype).view(view.shape)


@pytest.mark.cuda
def test_one_copy_per_stage(cuda_ring):
    inputs, _ = make("cuda", max_bs=64)
    rng = seeded_rng("one-copy")
    torch.cuda.synchronize()
    last = inputs["penalties"]
    dirty = 0  # rows of the last field that hold values (construction leaves every row at its fill)
    for n in [64, 5, 0, 33]:
        values = step_values(FIELDS, n, rng)
        before = pinstage.stats()
        inputs.stage(values, n)
        after = pinstage.stats()
        assert after["copies"] - before["copies"] == 1, "n=%d: %d copies" % (n, after["copies"] - before["copies"])
        assert after["calls"] - before["calls"] == 1, "n=%d" % n
        # One copy from the first field to the last field's row max(n, rows an earlier stage wrote).
        end = last.data_ptr() - inputs["input_ids"].data_ptr() + last[0].nbytes * max(n, dirty)
        assert after["bytes_staged"] - before["bytes_staged"] == end, "n=%d" % n
        dirty = n


@pytest.mark.cuda
@pytest.mark.parametrize("on_full", ["overflow", "wait"])
def test_values_right_while_the_stream_is_busy_and_the_ring_wraps(cuda_ring, on_full):
    """Hundreds of stages queued behind a sleeping kernel through a ring of a few copies' size: a
    region written again before its copy ran would show up in the clones taken after each stage."""
    inputs, ref = make("cuda", max_bs=32)
    ring = 4 * (inputs["penalties"].data_ptr() + inputs["penalties"].nbytes - inputs["input_ids"].data_ptr())
    pinstage.configure(ring_bytes=ring, on_full=on_full)
    rng = seeded_rng("busy", on_full)
    steps = [(n, step_values(FIELDS, n, rng)) for n in [rng.randint(0, 32) for _ in range(200)]]
    before = pinstage.stats()
    results, expected = [], []
    # overflow: every stage is queued behind the sleep; wait: the ring fills behind it and the host waits.
    # Under overflow every stage pins a new block (none is free behind the sleep): 200 of them outlasted
    # a 200 ms sleep on the H200.
    done = busy(1000 if on_full == "overflow" else 20)
    for n, values in steps:
        inputs.stage(values, n)
        ref.stage(values, n)
        results.append(allocation(inputs).clone())  # one device op per step: the launch queue stays short
        expected.append(ref.snapshot())
    if on_full == "overflow":
        assert_still_busy(done, "the stages were queued")
    torch.cuda.synchronize()
    after = pinstage.stats()
    for k, (flat, want) in enumerate(zip(results, expected)):
        for name in want:
            assert_same_tensor(
                field_of(inputs, flat, name),
                want[name].to(inputs.device),
                "step %d (n=%d), field %s" % (k, steps[k][0], name),
            )
    assert after["copies"] - before["copies"] == len(steps)
    if on_full == "overflow":
        assert after["overflows"] > before["overflows"], "the ring never overflowed: the test did not exercise it"
        assert after["waits"] == before["waits"], "on_full='overflow' waited"
    else:
        assert after["waits"] > before["waits"], "the ring never waited: its memory was not reused under copies"


@pytest.mark.cuda
def test_graph_captured_on_the_views_replays_each_stage(cuda_ring):
    fields = {
        "input_ids": Field(torch.int64),
        "positions": Field(torch.int64),
        "temperatures": Field(torch.float32, (1,), fill=1.0),
        "top_ks": Field(torch.int32, fill=1 << 30),
    }
    max_bs = 64
    inputs, ref = make("cuda", max_bs=max_bs, fields=fields)

    def step():
        return (
            inputs["input_ids"] * 3 + inputs["positions"],
            inputs["temperatures"] * 2,
            inputs["top_ks"].clamp(max=1 << 20),
        )

    graph, outs = captured(step)

    rng = seeded_rng("graph")
    results, expected = [], []
    done = busy(100)
    for n in [64, 1, 17, 0, 63, 8, 8, 40]:
        values = {
            "input_ids": [rng.randrange(1 << 40) for _ in range(n)],
            "positions": np.array([rng.randrange(1 << 20) for _ in range(n)], dtype=np.int64),
            "temperatures": torch.tensor([[rng.random()] for _ in range(n)], dtype=torch.float32),
            "top_ks": [rng.randrange(1, 1 << 25) for _ in range(n)],
        }
        inputs.stage(values, n)
        graph.replay()
        ref.stage(values, n)
        t = ref.tensors
        expected.append((t["input_ids"] * 3 + t["positions"], t["temperatures"] * 2, t["top_ks"].clamp(max=1 << 20)))
        results.append(tuple(o.clone() for o in outs))
    assert_still_busy(done, "the stages and replays were queued")
    torch.cuda.synchronize()
    for k, (got, want) in enumerate(zip(results, expected)):
        for j, (g, w) in enumerate(zip(got, want)):
            assert_same_tensor(g, w.to(inputs.device), "replay %d, output %d" % (k, j))


@pytest.mark.cuda
def test_stage_during_capture_is_refused(cuda_ring):
    inputs, ref = make("cuda")
    values = step_values(FIELDS, 4, seeded_rng("capture"))
    torch.cuda.synchronize()
    before = pinstage.stats()
    graph = torch.cuda.CUDAGraph()
    capture_stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=capture_stream):
        y = inputs["input_ids"] + 1
        with pytest.raises(RuntimeError, match="(?i)captur"):
            inputs.stage(values, 4)
        with pytest.raises(RuntimeError, match="(?i)captur"):
            inputs.stage(values, 4, stream=capture_stream)
        with pytest.raises(RuntimeError, match="(?i)captur"):
            StaticInputs(FIELDS, max_bs=4)
    graph.replay()
    torch.cuda.synchronize()
    assert pinstage.stats()["copies"] == before["copies"], "a refused stage enqueued a copy"
    assert_views(inputs, ref.tensors, "refused stages during capture")
    assert torch.equal(y.cpu(), ref.tensors["input_ids"] + 1), "the capture was disturbed"
    assert_nothing_staged(inputs, ref, "cuda", "refused stages during capture")


@pytest.mark.cuda
def test_stage_waits_for_nothing(cuda_ring):
    inputs, ref = make("cuda", max_bs=256)
    rng = seeded_rng("no-sync")
    steps = [(n, step_values(FIELDS, n, rng)) for n in [256, 7, 128, 0, 255]]
    inputs.stage(steps[0][1], steps[0][0])  # the ring and its events exist before the checked block
    ref.stage(steps[0][1], steps[0][0])
    torch.cuda.synchronize()
    done = busy(100)
    with pinstage.testing.no_sync():
        for n, values in steps:
            inputs.stage(values, n)
            ref.stage(values, n)
    assert_still_busy(done, "the stages returned")
    torch.cuda.synchronize()
    assert_views(inputs, ref.tensors, "after the unsynchronised stages")


@pytest.mark.cuda
def test_stage_on_a_side_stream(cuda_ring):
    inputs, ref = make("cuda")
    torch.cuda.synchronize()  # the construction's fill copy ran on the current stream
    side = torch.cuda.Stream()
    values = step_values(FIELDS, 11, seeded_rng("side"))
    done = busy(50, side)
    inputs.stage(values, 11, stream=side)
    ref.stage(values, 11)
    assert_still_busy(done, "the stage returned")
    side.synchronize()
    assert_views(inputs, ref.tensors, "a stage on a side stream")
