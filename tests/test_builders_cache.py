import numpy as np
import pytest
import torch
from gpu_busy import assert_still_busy, busy
from support import BATCH_SIZES, DEVICES, run_while_stream_busy
from tensor_kinds import WrapperTensor

from pinstage.builders import write_cache_indices

MAX_CONTEXT_LEN = 48
SENTINEL = -7  # cells no request owns must keep it


def random_batch(rng, bs, device):
    """A batch over a table with a few spare rows: distinct rows, random prefix/extend split."""
    rows = rng.sample(range(bs + 5), bs)
    prefix_lens = [rng.randint(0, 20) for _ in range(bs)]
    seq_lens = [p + rng.randint(0, MAX_CONTEXT_LEN - 20) for p in prefix_lens]
    extend_lens = [s - p for s, p in zip(seq_lens, prefix_lens)]
    prefix_tensors = [
        # Some prefixes are longer than used and some are views into a larger tensor, as radix-cache
        # values are.
        torch.randint(0, 1 << 20, (p + rng.randint(0, 3) + 2,), dtype=torch.int64, device=device)[2:]
        for p in prefix_lens
    ]
    out_cache_loc = torch.randint(0, 1 << 20, (sum(extend_lens),), dtype=torch.int64, device=device)
    table = torch.full((bs + 5, MAX_CONTEXT_LEN), SENTINEL, dtype=torch.int32, device=device)
    return dict(
        req_to_token=table,
        req_pool_indices=rows,
        prefix_tensors=prefix_tensors,
        prefix_lens=prefix_lens,
        seq_lens=seq_lens,
        extend_lens=extend_lens,
        out_cache_loc=out_cache_loc,
    )


def reference(batch):
    table = batch["req_to_token"].cpu().clone()
    out = batch["out_cache_loc"].cpu()
    offset = 0
    for row, prefix, p, s in zip(
        batch["req_pool_indices"], batch["prefix_tensors"], batch["prefix_lens"], batch["seq_lens"]
    ):
        table[row, :p] = prefix.cpu()[:p].to(torch.int32)
        table[row, p:s] = out[offset : offset + s - p].to(torch.int32)
        offset += s - p
    return table


def run(batch, **kw):
    write_cache_indices(*batch.values(), **kw)


def planned_offsets(extend_lens):
    """Each request's offset in out_cache_loc: its new tokens follow the previous request's."""
    return torch.from_numpy(np.cumsum([0] + list(extend_lens[:-1]), dtype=np.int64))[: len(extend_lens)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_writes_the_reference_rows(rng, device, bs):
    batch = random_batch(rng, bs, device)
    run(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(batch["req_to_token"].cpu(), reference(batch))


@pytest.mark.cuda
@pytest.mark.parametrize("bs", [1, 300])
def test_cuda_kernel_matches_cpu_path(rng, bs):
    cpu = random_batch(rng, bs, "cpu")
    cuda = {k: v for k, v in cpu.items()}
    cuda["req_to_token"] = cpu["req_to_token"].cuda()
    cuda["prefix_tensors"] = [t.cuda() for t in cpu["prefix_tensors"]]
    cuda["out_cache_loc"] = cpu["out_cache_loc"].cuda()
    run(cpu)
    run(cuda)
    torch.cuda.synchronize()
    assert torch.equal(cuda["req_to_token"].cpu(), cpu["req_to_token"])


@pytest.mark.cuda
def test_cache_builder_does_not_wait_for_a_busy_stream(rng):
    batch = random_batch(rng, 256, "cuda")
    expected = reference(batch)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the batch's tensors were made on the default stream
    run(batch, stream=stream)  # warm-up; then the table is emptied, so only the timed call can fill it
    stream.synchronize()
    batch["req_to_token"].fill_(SENTINEL)
    _, still_busy = run_while_stream_busy(lambda: run(batch, stream=stream), stream)
    assert still_busy, "write_cache_indices returned only after the busy stream finished"
    torch.cuda.synchronize()
    assert torch.equal(batch["req_to_token"].cpu(), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("on_full", ["overflow", "wait"])
def test_the_ring_region_the_kernel_reads_is_not_handed_out_before_it_runs(rng, cuda_ring, on_full):
    """The kernel reads its per-request values from their ring region when it runs, behind a busy
    stream. Through a ring too small for the calls (it overflows or waits), stagings made meanwhile
    must not get that region: their values (rows beyond every table) would make the kernel skip
    each request it read them for, leaving its row unwritten."""
    import pinstage

    pinstage.configure(ring_bytes=16 << 10, on_full=on_full)
    batches = [random_batch(rng, 16, "cuda") for _ in range(8)]
    expected = [reference(batch) for batch in batches]
    beyond = list(range(1 << 40, (1 << 40) + 1024))  # 8 KiB: two calls' stagings fill the ring
    torch.cuda.synchronize()
    before = pinstage.stats()
    done = busy(200 if on_full == "overflow" else 20)
    for batch in batches:
        run(batch)
        pinstage.stage_to_device(beyond, torch.int64)
    if on_full == "overflow":
        assert_still_busy(done, "the calls were queued")
    torch.cuda.synchronize()
    full = "overflows" if on_full == "overflow" else "waits"
    assert pinstage.stats()[full] > before[full], "the ring held every call: nothing was reused"
    for i, (batch, want) in enumerate(zip(batches, expected)):
        assert torch.equal(batch["req_to_token"].cpu(), want), f"batch {i}"


def corrupt(batch, field, value, index=2):
    if field == "out_cache_loc":
        batch[field] = value
    else:
        batch[field][index] = value


BAD_INPUTS = [
    ("req_pool_indices", 10_000, IndexError, r"request 2: req_pool_indices is 10000, outside req_to_token's"),
    ("req_pool_indices", -1, IndexError, r"request 2: req_pool_indices is -1"),
    ("prefix_lens", -1, ValueError, r"request 2: prefix_lens is negative"),
    ("seq_lens", 0, ValueError, r"request 2: seq_lens \(0\) < prefix_lens"),
    ("seq_lens", MAX_CONTEXT_LEN + 1, ValueError, r"request 2: seq_lens \(49\) > req_to_token's max_context_len"),
    ("extend_lens", 99, ValueError, r"request 2: extend_lens \(99\) != seq_lens - prefix_lens"),
    ("extend_lens", "3", TypeError, r"request 2: extend_lens must be an int"),
    ("prefix_lens", 5.0, TypeError, r"request 2: prefix_lens must be an int, got float"),  # not truncated
    ("prefix_tensors", [1, 2, 3], TypeError, r"request 2: prefix_tensors entry must be a tensor"),
    (
        "prefix_tensors",
        torch.zeros(30, dtype=torch.int32),
        TypeError,
        r"request 2: prefix_tensors entry must be torch.int64, got torch.int32",
    ),
    (
        "prefix_tensors",
        torch.zeros(30, dtype=torch.int64, device="meta"),
        ValueError,
        r"request 2: prefix_tensors entry is on meta but req_to_token is on cpu",
    ),
    (
        "prefix_tensors",
        torch.zeros(1, dtype=torch.int64),
        ValueError,
        r"request 2: prefix_tensors entry has 1 elements but prefix_lens is 5",
    ),
    (
        "prefix_tensors",
        torch.zeros(60, dtype=torch.int64)[::2],
        ValueError,
        r"request 2: prefix_tensors entry must be contiguous",
    ),
    (
        "prefix_tensors",
        torch.zeros(6, 6, dtype=torch.int64),
        ValueError,
        r"request 2: prefix_tensors entry must be 1-D",
    ),
    (
        "out_cache_loc",
        torch.zeros(3, dtype=torch.int64),
        ValueError,
        r"extend_lens add up to \d+ but out_cache_loc has 3",
    ),
    (
        "out_cache_loc",
        torch.zeros(3, dtype=torch.int32),
        TypeError,
        r"out_cache_loc must be torch.int64, got torch.int32",
    ),
]


@pytest.mark.parametrize(
    "field, value, error, message", BAD_INPUTS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)]
)
def test_bad_input_raises_before_anything_is_written(rng, field, value, error, message):
    batch = random_batch(rng, 4, "cpu")
    batch["prefix_lens"][2], batch["seq_lens"][2], batch["extend_lens"][2] = 5, 9, 4
    batch["prefix_tensors"][2] = torch.arange(5, dtype=torch.int64)
    batch["out_cache_loc"] = torch.arange(sum(batch["extend_lens"]), dtype=torch.int64)
    corrupt(batch, field, value)
    with pytest.raises(error, match=message):
        run(batch)
    assert (batch["req_to_token"] == SENTINEL).all()


@pytest.mark.parametrize("field", ["prefix_tensors", "prefix_lens", "seq_lens", "extend_lens"])
def test_lists_of_different_lengths_are_rejected(rng, field):
    batch = random_batch(rng, 4, "cpu")
    batch[field] = batch[field][:3]
    with pytest.raises(ValueError, match=rf"{field} has 3 entries but req_pool_indices has 4"):
        run(batch)


NOT_INTEGERS = [
    (torch.tensor([0.9, 2.7, 1.5, 3.2]), r"prefix_lens must hold integers, got a tensor of torch.float32"),
    (torch.tensor([True, False, True, True]), r"prefix_lens must hold integers, got a tensor of torch.bool"),
    (np.array([0.9, 2.7, 1.5, 3.2]), r"prefix_lens must hold integers, got a numpy array of float64"),
    (np.array([True, False, True, True]), r"prefix_lens must hold integers, got a numpy array of bool"),
    ([True, 2, 0, 1], r"request 0: prefix_lens must be an int, got bool"),
    ([0, np.bool_(True), 0, 1], r"request 1: prefix_lens must be an int, got bool"),
    ([0, 1, torch.tensor(True), 1], r"request 2: prefix_lens must be an int, got a tensor of torch.bool"),
    ([0, 1, 2, torch.tensor(0.9)], r"request 3: prefix_lens must be an int, got a tensor of torch.float32"),
]


@pytest.mark.parametrize("column, message", NOT_INTEGERS, ids=[f"case{i}" for i in range(len(NOT_INTEGERS))])
def test_float_and_bool_columns_are_refused_not_truncated(rng, column, message):
    """numpy and torch read 0.9 as 0 and True as 1: another request's row would be written."""
    batch = random_batch(rng, 4, "cpu")
    batch["prefix_lens"] = column
    with pytest.raises(TypeError, match=message):
        run(batch)
    assert (batch["req_to_token"] == SENTINEL).all()


@pytest.mark.parametrize("value", [2**63, 2**64, -(2**63) - 1])
@pytest.mark.parametrize("kind", ["ints", "with a numpy int"])
def test_a_list_value_beyond_int64_is_refused_naming_the_field_and_request(rng, value, kind):
    """Lists of Python ints are converted together, other lists column by column: both name the
    field and the request of a value no int64 holds."""
    batch = random_batch(rng, 4, "cpu")
    batch["seq_lens"][2] = value
    if kind != "ints":
        batch["prefix_lens"][0] = np.int64(batch["prefix_lens"][0])
    with pytest.raises(ValueError, match=rf"write_cache_indices: seq_lens: .*element \[2\] = {value} "):
        run(batch)
    assert (batch["req_to_token"] == SENTINEL).all()


class IndexRaisingFrom:
    """An entry whose __index__ raises an error with a cause, as a user's conversion code may."""

    def __index__(self):
        raise ValueError("outer") from LookupError("cause")


def test_an_entry_error_keeps_its_cause_when_named(rng):
    """The builder names the field of an entry whose own conversion raised, keeping that error's cause."""
    batch = random_batch(rng, 4, "cpu")
    batch["seq_lens"][2] = IndexRaisingFrom()
    with pytest.raises(ValueError, match=r"write_cache_indices: seq_lens: .*element \[2\].*outer") as info:
        run(batch)
    assert type(info.value.__cause__) is LookupError and info.value.__cause__.args == ("cause",)
    assert (batch["req_to_token"] == SENTINEL).all()


def test_a_device_tensor_column_is_refused_by_name(rng):
    """Reading a device column's values would wait for the GPU: the host's own values are asked for
    (a meta tensor stands for any device here)."""
    batch = random_batch(rng, 4, "cpu")
    batch["seq_lens"] = torch.tensor(batch["seq_lens"], device="meta")
    with pytest.raises(TypeError, match=r"^write_cache_indices: seq_lens must be host values .* got a tensor on meta$"):
        run(batch)
    assert (batch["req_to_token"] == SENTINEL).all()


@pytest.mark.parametrize("column", ["array", "one-request list"])
def test_a_value_numpy_reads_as_uint64_is_refused_naming_the_field_and_request(rng, column):
    """A uint64 array, or a list whose every value is >= 2**63 (numpy makes it uint64)."""
    bs = 4 if column == "array" else 1
    batch = random_batch(rng, bs, "cpu")
    batch["seq_lens"] = np.array([0, 0, 2**63 + 1, 0], dtype=np.uint64) if column == "array" else [2**63 + 1]
    row = 2 if column == "array" else 0
    with pytest.raises(
        ValueError, match=rf"write_cache_indices: seq_lens: request {row}: 9223372036854775809 is beyond int64"
    ):
        run(batch)
    assert (batch["req_to_token"] == SENTINEL).all()


def test_integer_tensors_and_arrays_of_any_width_are_columns(rng):
    batch = random_batch(rng, 5, "cpu")
    expected = reference(batch)
    columns = ("req_pool_indices", "prefix_lens", "seq_lens", "extend_lens")
    strided = lambda v: torch.tensor(v).repeat_interleave(2)[::2]  # noqa: E731
    for convert in (
        lambda v: torch.tensor(v, dtype=torch.int32),
        torch.tensor,
        strided,
        lambda v: np.array(v, dtype=np.uint16),
        lambda v: [np.int32(x) for x in v],
        lambda v: np.array(v, dtype=object),  # its entries are checked, then read as a list
    ):
        batch["req_to_token"].fill_(SENTINEL)
        write_cache_indices(*(convert(v) if k in columns else v for k, v in batch.items()))
        assert torch.equal(batch["req_to_token"], expected)
    empty = torch.full((2, 4), SENTINEL, dtype=torch.int32)
    none = np.array([])
    write_cache_indices(empty, none, [], none, none, none, torch.zeros(0, dtype=torch.int64))
    assert (empty == SENTINEL).all()  # numpy's empty array is float64: an empty batch all the same
    none = torch.tensor([])  # so is torch's (float32)
    write_cache_indices(empty, none, [], none, none, none, torch.zeros(0, dtype=torch.int64))
    assert (empty == SENTINEL).all()


@pytest.mark.parametrize("device", DEVICES)
def test_a_table_of_one_column_may_have_any_stride(device):
    """A column's stride is never used where a row has one slot: such a view is written like any table."""
    table = torch.full((4, 8), SENTINEL, dtype=torch.int32, device=device)[:, ::8]
    write_cache_indices(table, [2], [torch.arange(0, device=device)], [0], [1], [1], torch.tensor([5], device=device))
    assert table[:, 0].tolist() == [SENTINEL, SENTINEL, 5, SENTINEL]


def test_req_to_token_must_be_int32_rows():
    table = torch.zeros(4, 8, dtype=torch.int64)
    with pytest.raises(TypeError, match="req_to_token must be torch.int32, got torch.int64"):
        write_cache_indices(table, [], [], [], [], [], torch.zeros(0, dtype=torch.int64))


def op_args(rows, prefix_lens, seq_lens, offsets, prefix_sizes):
    """The compiled op's per-request tensors (CPU), and one prefix tensor of each size."""
    prefixes = [torch.arange(10, 10 + n, dtype=torch.int64) for n in prefix_sizes]
    columns = [torch.tensor(v, dtype=torch.int64) for v in (rows, prefix_lens, seq_lens, offsets)]
    return columns[0], prefixes, columns[1], columns[2], columns[3]


@pytest.mark.parametrize(
    "rows, prefix_lens, seq_lens, offsets, prefix_sizes, message",
    [
        ([0, 4], [0, 0], [1, 1], [0, 1], [0, 0], r"request 1: req_pool_indices is 4"),
        ([0, 1], [0, 2], [1, 1], [0, 1], [0, 2], r"request 1: seq_lens \(1\) < prefix_lens \(2\)"),
        ([0, 1], [0, 0], [1, 2], [0, 1], [0, 0], r"request 1: out_cache_offsets is 1 with 2 new tokens, outside"),
        (
            [0, 1],
            [0, 2],
            [1, 3],
            [0, 1],
            [0, 1],
            r"request 1: prefix_tensors entry has 1 elements but prefix_lens is 2",
        ),
    ],
)
def test_compiled_op_checks_cpu_values_itself(rows, prefix_lens, seq_lens, offsets, prefix_sizes, message):
    table = torch.full((4, 8), SENTINEL, dtype=torch.int32)
    rows_t, prefixes, prefix_t, seq_t, offsets_t = op_args(rows, prefix_lens, seq_lens, offsets, prefix_sizes)
    with pytest.raises((IndexError, ValueError), match=message):
        torch.ops.pinstage.write_cache_indices(table, rows_t, prefixes, prefix_t, seq_t, offsets_t, torch.arange(2))
    assert (table == SENTINEL).all()


def test_compiled_op_takes_prefix_tensors_never_addresses():
    """A public op must not read memory at an address its caller names: prefix_tensors is a Tensor[],
    and a tensor of addresses is refused."""
    schema = str(torch.ops.pinstage.write_cache_indices.default._schema)
    assert "Tensor[] prefix_tensors" in schema and "pointer" not in schema, schema
    table = torch.zeros(4, 8, dtype=torch.int32)
    rows_t, prefixes, prefix_t, seq_t, offsets_t = op_args([0], [1], [1], [0], [1])
    addresses = torch.tensor([prefixes[0].data_ptr()], dtype=torch.uint64)
    with pytest.raises((TypeError, RuntimeError)):
        torch.ops.pinstage.write_cache_indices(table, rows_t, addresses, prefix_t, seq_t, offsets_t, torch.arange(1))
    with pytest.raises((TypeError, RuntimeError)):
        torch.ops.pinstage.write_cache_indices(table, rows_t, [addresses], prefix_t, seq_t, offsets_t, torch.arange(1))
    assert (table == 0).all()


def test_compiled_op_checks_tensor_arguments():
    table = torch.zeros(4, 8, dtype=torch.int32)
    rows_t, prefixes, prefix_t, seq_t, offsets_t = op_args([0], [0], [1], [0], [0])
    with pytest.raises(TypeError, match="request 0: prefix_tensors entry must be torch.int64, got torch.int32"):
        torch.ops.pinstage.write_cache_indices(
            table, rows_t, [prefixes[0].int()], prefix_t, seq_t, offsets_t, torch.arange(1)
        )
    with pytest.raises(ValueError, match="prefix_tensors has 2 entries but req_pool_indices has 1"):
        torch.ops.pinstage.write_cache_indices(table, rows_t, prefixes * 2, prefix_t, seq_t, offsets_t, torch.arange(1))
    # One count message for the op and its host plan; then the shape.
    with pytest.raises(ValueError, match="seq_lens has 2 entries but req_pool_indices has 1"):
        torch.ops.pinstage.write_cache_indices(
            table, rows_t, prefixes, prefix_t, torch.arange(2), offsets_t, torch.arange(1)
        )
    with pytest.raises(ValueError, match="seq_lens must be a contiguous 1-D tensor of 1 elements"):
        torch.ops.pinstage.write_cache_indices(
            table, rows_t, prefixes, prefix_t, torch.ones(1, 1, dtype=torch.int64), offsets_t, torch.arange(1)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_a_prefix_tensor_without_memory_of_its_own_is_refused_on_the_host(device):
    """A wrapper subclass's data pointer is null: the kernel would read address 0 (on CUDA the
    process loses its context). The builder and the op itself refuse it before anything runs."""
    table = torch.full((2, 8), SENTINEL, dtype=torch.int32, device=device)
    out_cache_loc = torch.tensor([9], dtype=torch.int64, device=device)
    for prefix in (
        WrapperTensor(torch.arange(4, device=device)),
        torch._efficientzerotensor(4, device=device, dtype=torch.int64),
    ):
        # Through the dispatcher (the builder calls the op) a zero tensor arrives materialised as a
        # stride-0 expansion: refused as not contiguous.
        refused = pytest.raises(
            (TypeError, ValueError), match="request 0: prefix_tensors entry (has no memory|must be contig)"
        )
        with refused:
            write_cache_indices(table, [0], [prefix], [2], [3], [1], out_cache_loc)
        rows_t, _, prefix_t, seq_t, offsets_t = (
            t.to(device) if isinstance(t, torch.Tensor) else t for t in op_args([0], [2], [3], [0], [0])
        )
        with refused:
            torch.ops.pinstage.write_cache_indices(table, rows_t, [prefix], prefix_t, seq_t, offsets_t, out_cache_loc)
    if device == "cuda":
        torch.cuda.synchronize()
    assert (table == SENTINEL).all()


@pytest.mark.cuda
def test_cuda_op_takes_cpu_values_and_device_values_alike(rng):
    """The CUDA op's kernel reads CPU per-request values with its prefix table from one ring region,
    or device ones where they are: both write the reference rows. A prefix_lens beyond a prefix tensor's
    length is refused on the host when the values are there, and skipped by the kernel when they
    are on the device (the host cannot read them without waiting)."""
    batch = random_batch(rng, 6, "cuda")
    offsets = planned_offsets(batch["extend_lens"])
    cpu = [torch.tensor(batch[f], dtype=torch.int64) for f in ("req_pool_indices", "prefix_lens", "seq_lens")]
    for where in ("cpu", "cuda"):
        batch["req_to_token"].fill_(SENTINEL)
        rows_t, prefix_t, seq_t, offsets_t = (t.to(where) for t in (*cpu, offsets))
        torch.ops.pinstage.write_cache_indices(
            batch["req_to_token"], rows_t, batch["prefix_tensors"], prefix_t, seq_t, offsets_t, batch["out_cache_loc"]
        )
        torch.cuda.synchronize()
        assert torch.equal(batch["req_to_token"].cpu(), reference(batch)), where
    batch["req_to_token"].fill_(SENTINEL)
    short = [p[:0] for p in batch["prefix_tensors"]]
    with pytest.raises(ValueError, match="prefix_tensors entry has 0 elements but prefix_lens is"):
        torch.ops.pinstage.write_cache_indices(
            batch["req_to_token"], *cpu[:1], short, *cpu[1:], offsets, batch["out_cache_loc"]
        )
    rows_d, prefix_d, seq_d, offsets_d = (t.cuda() for t in (*cpu, offsets))
    torch.ops.pinstage.write_cache_indices(
        batch["req_to_token"], rows_d, short, prefix_d, seq_d, offsets_d, batch["out_cache_loc"]
    )
    torch.cuda.synchronize()
    skipped = [row for row, p in zip(batch["req_pool_indices"], batch["prefix_lens"]) if p > 0]
    assert skipped and (batch["req_to_token"][skipped] == SENTINEL).all()


@pytest.mark.parametrize("entry", [True, np.int64(2), 2**63, -(2**63) - 1])
def test_the_compiled_call_takes_lists_of_python_ints_and_leaves_the_rest_to_the_builder(entry):
    """The builder's compiled call converts lists of Python ints itself. A list holding anything
    else (a bool, a numpy int, an int beyond int64) makes it return False having written nothing,
    for the builder's checked path to name; a column that is neither a list nor a tensor, or lists
    mixed with tensors, is refused."""
    from pinstage import _C

    table = torch.full((2, 4), SENTINEL, dtype=torch.int32)
    out_cache_loc = torch.tensor([9, 8], dtype=torch.int64)
    prefixes = [torch.empty(0, dtype=torch.int64)]
    assert not _C.write_cache_indices(table, [0], prefixes, [0], [2], out_cache_loc, [entry])
    assert (table == SENTINEL).all()
    with pytest.raises(TypeError, match="req_pool_indices must be a list or a tensor here, got tuple"):
        _C.write_cache_indices(table, (0,), prefixes, [0], [2], out_cache_loc, [2])
    with pytest.raises(TypeError, match="columns must be all lists or all tensors here; seq_lens is Tensor"):
        _C.write_cache_indices(table, [0], prefixes, [0], torch.tensor([2]), out_cache_loc, [2])
    assert (table == SENTINEL).all()
    assert _C.write_cache_indices(table, [0], prefixes, [0], [2], out_cache_loc, [2])
    assert table[0].tolist() == [9, 8, SENTINEL, SENTINEL]


def test_an_index_method_that_mutates_the_other_lists_reads_a_snapshot():
    """Reading an int can run Python code (__index__); the lists it changes were copied first."""
    prefix_tensors = [torch.tensor([7, 8], dtype=torch.int64)]

    class ClearsThePrefixes:
        def __index__(self):
            prefix_tensors.clear()
            return 0

    table = torch.zeros((1, 4), dtype=torch.int32)
    out_cache_loc = torch.tensor([9], dtype=torch.int64)
    write_cache_indices(table, [ClearsThePrefixes()], prefix_tensors, [2], [3], [1], out_cache_loc)
    assert table.tolist() == [[7, 8, 9, 0]]


@pytest.mark.parametrize("device", DEVICES)
def test_write_cache_indices_op_passes_opcheck(rng, device):
    """Schema (req_to_token is declared mutated), fake-tensor, autograd and AOT dispatch checks."""
    batch = random_batch(rng, 6, device)
    offsets = planned_offsets(batch["extend_lens"])
    args = (
        batch["req_to_token"],
        torch.tensor(batch["req_pool_indices"], device=device),
        batch["prefix_tensors"],
        torch.tensor(batch["prefix_lens"], device=device),
        torch.tensor(batch["seq_lens"], device=device),
        offsets.to(device),
        batch["out_cache_loc"],
    )
    torch.library.opcheck(torch.ops.pinstage.write_cache_indices.default, args)  # works on copies of args
    torch.ops.pinstage.write_cache_indices(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(batch["req_to_token"].cpu(), reference(batch))


@pytest.mark.cuda
def test_cuda_op_refuses_a_capturing_stream(rng):
    """The op's kernel reads its prefix table from the staging ring: a captured kernel would read
    ring memory reused long before the graph replays."""
    batch = random_batch(rng, 3, "cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        batch["out_cache_loc"] * 2  # the graph captures something
        with pytest.raises(RuntimeError, match="(?i)captur"):
            run(batch)
    run(batch)
    torch.cuda.synchronize()
    assert torch.equal(batch["req_to_token"].cpu(), reference(batch))


@pytest.mark.parametrize("device", DEVICES)
def test_the_op_computes_the_offsets_from_host_values(rng, device):
    """out_cache_offsets=None (the pinstage builder's one call): the op checks the CPU per-request
    values and lays the requests' new tokens out one after another, as planned offsets do; values
    already on the device need the planned offsets."""
    batch = random_batch(rng, 6, device)
    expected = reference(batch)
    table, rows, prefixes, prefix_lens, seq_lens, extend_lens, out_cache_loc = batch.values()
    cpu = [torch.tensor(v, dtype=torch.int64) for v in (rows, prefix_lens, seq_lens)]
    offsets = planned_offsets(extend_lens)
    torch.ops.pinstage.write_cache_indices(table, *cpu[:1], prefixes, *cpu[1:], offsets, out_cache_loc)
    planned = table.clone()
    table.fill_(SENTINEL)
    torch.ops.pinstage.write_cache_indices(table, *cpu[:1], prefixes, *cpu[1:], None, out_cache_loc)
    assert torch.equal(table.cpu(), planned.cpu()) and torch.equal(table.cpu(), expected)
    with pytest.raises(ValueError, match=r"extend_lens add up to \d+ but out_cache_loc has 3 elements"):
        torch.ops.pinstage.write_cache_indices(table, *cpu[:1], prefixes, *cpu[1:], None, out_cache_loc[:3])
    wrong = torch.tensor(extend_lens) + torch.tensor([0] * 5 + [1])
    with pytest.raises(ValueError, match=r"request 5: extend_lens \(\d+\) != seq_lens - prefix_lens"):
        torch.ops.pinstage.write_cache_indices(table, *cpu[:1], prefixes, *cpu[1:], None, out_cache_loc, wrong)
    if device == "cuda":
        on_device = [t.to(device) for t in cpu]
        with pytest.raises(ValueError, match="out_cache_offsets may be None only when the per-request values are CPU"):
            torch.ops.pinstage.write_cache_indices(table, *on_device[:1], prefixes, *on_device[1:], None, out_cache_loc)
        with pytest.raises(ValueError, match="extend_lens is checked on the host"):
            torch.ops.pinstage.write_cache_indices(
                table,
                *on_device[:1],
                prefixes,
                *on_device[1:],
                offsets.to(device),
                out_cache_loc,
                torch.tensor(extend_lens),
            )


def test_the_builder_refuses_fake_tensors_where_the_op_serves_them():
    """The builder calls the kernel without torch's dispatcher (docs/limits.md): under a fake mode
    it raises, naming the argument, while the op's fake kernel writes nothing and returns."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        table = torch.zeros(4, 16, dtype=torch.int32)
        prefix, out_cache_loc = torch.arange(2), torch.arange(3)
        with pytest.raises(TypeError, match="write_cache_indices: req_to_token has no memory of its own"):
            write_cache_indices(table, [1], [prefix], [2], [5], [3], out_cache_loc)
        with pytest.raises(TypeError, match="req_to_token has no memory of its own"):  # an empty batch too
            write_cache_indices(table, [], [], [], [], [], torch.arange(0))
        rows, prefix_lens, seq_lens, extend_lens = (torch.tensor([v]) for v in (1, 2, 5, 3))
        torch.ops.pinstage.write_cache_indices(
            table, rows, [prefix], prefix_lens, seq_lens, None, out_cache_loc, extend_lens
        )
    real_table = torch.zeros(4, 16, dtype=torch.int32)
    with FakeTensorMode():
        fake_loc = torch.arange(3)
    with pytest.raises(TypeError, match="out_cache_loc has no memory of its own"):
        write_cache_indices(real_table, [1], [torch.arange(2)], [2], [5], [3], fake_loc)
    assert not real_table.any()


def test_negative_views_are_read_as_their_values_or_refused():
    """A negative view's bytes are the negatives of its values (torch's dispatcher resolves it
    before an op's kernel): a per-request column is read as its values, a tensor the kernel reads
    is refused, naming it; nothing is written then."""
    table = torch.zeros(4, 8, dtype=torch.int32)
    rows = torch._neg_view(torch.tensor([-1]))  # the value 1
    write_cache_indices(table, rows, [torch.arange(0)], [0], [3], [3], torch.arange(3))
    assert table[1].tolist() == [0, 1, 2, 0, 0, 0, 0, 0] and not table[[0, 2, 3]].any()
    table.zero_()
    with pytest.raises(ValueError, match="out_cache_loc is a negative view"):
        write_cache_indices(table, [1], [torch.arange(0)], [0], [3], [3], torch._neg_view(torch.arange(3)))
    with pytest.raises(ValueError, match="request 0: prefix_tensors entry is a negative view"):
        write_cache_indices(table, [1], [torch._neg_view(torch.arange(2))], [2], [3], [1], torch.arange(1))
    assert not table.any()
