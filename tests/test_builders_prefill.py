"""stage_prefill: a prefill's lists, sampling values and logits indices in one copy, and its cache
rows written behind that copy, equal to what the builders give one by one."""

import numpy as np
import pytest
import torch
from staging_reference import assert_same_tensor
from support import (
    DEVICES,
    assert_fields_equal,
    is_host_to_device_copy,
    profiled_on_device,
    random_params,
    run_while_stream_busy,
)

import pinstage
from pinstage import _C
from pinstage.builders import (
    BatchState,
    CacheRows,
    Request,
    build_logprob_indices,
    build_sampling_batch,
    sampling_fields,
    stage_prefill,
    write_cache_indices,
)

MAX_CONTEXT_LEN = 64
SENTINEL = -7  # cells no request owns keep it
# int64 values that, with a 12-request Prefill's items (under 32 KB), keep a staging under the bound
# up to which stage_prefill's launch copies the items itself, or take it just over (the copy engine).
UNDER_THE_BOUND = (_C.PREFILL_BLOCKS_COPY_MAX_BYTES - (64 << 10)) // 8
OVER_THE_BOUND = _C.PREFILL_BLOCKS_COPY_MAX_BYTES // 8 + 1


class Prefill:
    """One random prefill: bs requests, each with a row of a spare-rowed table, a cached prefix of
    0-16 slots and 1-40 new tokens, some asking for input logprobs."""

    def __init__(self, rng, bs, device):
        self.device = device
        self.lens = [rng.randint(1, 40) for _ in range(bs)]
        self.starts = [rng.choice([n, rng.randint(0, n), 0]) for n in self.lens]
        self.rows = rng.sample(range(bs + 3), bs)
        self.prefix_lens = [rng.randint(0, 16) for _ in range(bs)]
        self.seq_lens = [p + n for p, n in zip(self.prefix_lens, self.lens)]
        self.ids = [rng.randint(0, 50_000) for _ in range(sum(self.lens))]
        self.positions = [p + i for p, n in zip(self.prefix_lens, self.lens) for i in range(n)]
        self.locations = rng.sample(range(1 << 20), sum(self.lens))
        self.prefixes = [
            torch.randint(0, 1 << 20, (p + 2,), dtype=torch.int64, device=device) for p in self.prefix_lens
        ]
        self.params = random_params(rng, bs)
        self.table = torch.full((bs + 3, MAX_CONTEXT_LEN), SENTINEL, dtype=torch.int32, device=device)

    def items(self):
        """The prompt ids, positions and out_cache_loc (item 2, as cache_rows names it), int64."""
        return [(self.ids, torch.int64), (self.positions, torch.int64), (self.locations, torch.int64)]

    def cache_rows(self, column=list):
        return CacheRows(
            self.table, column(self.rows), self.prefixes, column(self.prefix_lens), column(self.seq_lens), 2
        )

    def stage(self, sampling_source=None, column=list, **where):
        """(ids, positions, out_cache_loc, LogprobIndices, SamplingBatch), req_to_token written."""
        fields, make_batch = (
            sampling_fields(self.params) if sampling_source is None else sampling_source.sampling_fields()
        )
        items = self.items() + [(values, dtype) for _, values, dtype in fields]
        staged, indices = stage_prefill(items, column(self.lens), column(self.starts), self.cache_rows(column), **where)
        return staged[0], staged[1], staged[2], indices, make_batch(staged[3:])

    def expected_table(self):
        table = torch.full_like(self.table, SENTINEL)
        loc = torch.tensor(self.locations, dtype=torch.int64, device=self.device)
        write_cache_indices(table, self.rows, self.prefixes, self.prefix_lens, self.seq_lens, self.lens, loc)
        return table

    def assert_equals_the_builders(self, staged):
        ids, positions, loc, indices, batch = staged
        for name, got, values in (("ids", ids, self.ids), ("positions", positions, self.positions)):
            assert_same_tensor(got, torch.tensor(values, dtype=torch.int64, device=self.device), name)
        assert_same_tensor(loc, torch.tensor(self.locations, dtype=torch.int64, device=self.device), "out_cache_loc")
        assert_fields_equal(indices, build_logprob_indices(self.lens, self.starts, device=self.device))
        assert_fields_equal(batch, build_sampling_batch(self.params, device=self.device))
        assert torch.equal(self.table.cpu(), self.expected_table().cpu()), "req_to_token"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bs", [1, 9, 300])
def test_one_call_equals_the_builders(rng, device, bs):
    prefill = Prefill(rng, bs, device)
    prefill.assert_equals_the_builders(prefill.stage(device=device))


@pytest.mark.parametrize("column", [np.array, torch.tensor])
@pytest.mark.parametrize("device", DEVICES)
def test_array_and_tensor_columns_take_the_builders_checked_path_with_equal_results(rng, device, column):
    prefill = Prefill(rng, 20, device)
    prefill.assert_equals_the_builders(prefill.stage(column=column, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_values_from_the_joining_requests_batch_state(rng, device):
    """A prefill batch's own BatchState (its requests added as they join) gives the sampling values
    the list builder gives, in the same one staging."""
    prefill = Prefill(rng, 40, device)
    joining = BatchState()
    for row, params in enumerate(prefill.params):
        joining.add(Request([1], req_pool_idx=row, sampling_params=params))
    prefill.assert_equals_the_builders(prefill.stage(sampling_source=joining, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_without_cache_rows_it_stages_the_items_and_the_indices(device):
    items = [([1, 2, 3], torch.int64), ([0.5], torch.float32)]
    staged, indices = stage_prefill(items, [4, 5, 6], [0, 5, 3], device=device)
    assert_same_tensor(staged[0], torch.tensor([1, 2, 3], device=device), "item 0")
    assert_same_tensor(staged[1], torch.tensor([0.5], device=device), "item 1")
    assert_fields_equal(indices, build_logprob_indices([4, 5, 6], [0, 5, 3], device=device))


@pytest.mark.parametrize("column", [list, np.array])
@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(item=[1.5j]), TypeError, "item 1"),
        (dict(lens=0), ValueError, "request 2: extend_seq_lens must be >= 1"),
        (dict(starts=99), ValueError, "request 2: extend_logprob_start_lens must be in"),
        (dict(rows=10_000), IndexError, "request 2: req_pool_indices is 10000"),
        (dict(seq=MAX_CONTEXT_LEN + 1), ValueError, "request 2: seq_lens"),
        (dict(loc_item=7), IndexError, "out_cache_loc is item 7 but there are"),
    ],
)
def test_bad_input_raises_and_writes_nothing(rng, column, change, error, message):
    """Every check comes before the cache rows are written: req_to_token keeps every cell. (On the
    list path nothing is staged either: the CUDA case below counts copies.)"""
    prefill = Prefill(rng, 5, "cpu")
    items = [(prefill.ids, torch.int64), (change.get("item", [1]), torch.int64), (prefill.locations, torch.int64)]
    lens, starts, rows, seq = list(prefill.lens), list(prefill.starts), list(prefill.rows), list(prefill.seq_lens)
    lens[2] = change.get("lens", lens[2])
    starts[2] = change.get("starts", starts[2])
    rows[2] = change.get("rows", rows[2])
    seq[2] = change.get("seq", seq[2])
    loc_item = change.get("loc_item", 2)
    cache = CacheRows(prefill.table, column(rows), prefill.prefixes, column(prefill.prefix_lens), column(seq), loc_item)
    with pytest.raises(error, match=message):
        stage_prefill(items, column(lens), column(starts), cache)
    assert (prefill.table == SENTINEL).all(), "req_to_token was written"


@pytest.mark.parametrize("column", [list, np.array, torch.tensor])
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(req_to_token=None), "req_to_token must be a tensor, got NoneType"),
        (dict(out_cache_loc=True), "out_cache_loc must be the index of an item \\(an int\\), got bool"),
        (dict(out_cache_loc=np.int64(2)), "out_cache_loc must be the index of an item \\(an int\\), got int64"),
        (dict(out_cache_loc=2.0), "out_cache_loc must be the index of an item \\(an int\\), got float"),
    ],
)
def test_cache_rows_of_the_wrong_type_raise_the_same_error_for_every_column_form(rng, column, change, message):
    """A None req_to_token is not "no cache rows", with or without a device given; every column form
    (the compiled path's lists, the checked path's arrays and tensors) raises the same TypeError."""
    prefill = Prefill(rng, 3, "cpu")
    items = [(prefill.ids, torch.int64), (prefill.locations, torch.int64)]
    cache = prefill.cache_rows(column)._replace(out_cache_loc=1)._replace(**change)
    for device in (None, "cpu"):
        with pytest.raises(TypeError, match=message):
            stage_prefill(items, column(prefill.lens), column(prefill.starts), cache, device=device)
    assert (prefill.table == SENTINEL).all()


@pytest.mark.parametrize("column", [list, np.array, torch.tensor])
def test_out_cache_loc_must_be_staged_as_one_int64_per_new_token(rng, column):
    """The same error type for every column form (the compiled path's lists, the checked path's
    arrays and tensors), as write_cache_indices raises them: the dtype a TypeError, the shape a
    ValueError."""
    prefill = Prefill(rng, 3, "cpu")
    lens, starts, cache = column(prefill.lens), column(prefill.starts), prefill.cache_rows(column)
    cache = cache._replace(out_cache_loc=0)
    with pytest.raises(TypeError, match=r"out_cache_loc .*torch.int64"):
        stage_prefill([(prefill.locations, torch.int32)], lens, starts, cache)
    with pytest.raises(ValueError, match=r"out_cache_loc .*1-D"):
        stage_prefill([([[v] for v in prefill.locations], torch.int64)], lens, starts, cache)
    assert (prefill.table == SENTINEL).all()


def test_out_cache_loc_must_hold_every_new_token(rng):
    prefill = Prefill(rng, 3, "cpu")
    short = [(prefill.locations[:-1], torch.int64)]
    with pytest.raises(ValueError, match="extend_lens add up to"):
        stage_prefill(short, prefill.lens, prefill.starts, prefill.cache_rows()._replace(out_cache_loc=0))
    assert (prefill.table == SENTINEL).all()


@pytest.mark.cuda
def test_one_copy_and_the_cache_rows_behind_a_busy_stream(rng):
    """The staging returns while the stream is still busy, makes one copy, and the kernel reads the
    staged out_cache_loc behind that copy on the same stream: every value is right once it ran."""
    prefill = Prefill(rng, 64, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the prefixes and the table were made on the default stream
    prefill.stage(stream=stream)  # warm-up; then the table is emptied, so only the timed call can fill it
    stream.synchronize()
    prefill.table.fill_(SENTINEL)
    stream.wait_stream(torch.cuda.current_stream())  # the fill, on the default stream, comes first
    before = pinstage.stats()
    staged, still_busy = run_while_stream_busy(lambda: prefill.stage(stream=stream), stream)
    after = pinstage.stats()
    assert still_busy, "stage_prefill returned only after the busy stream finished"
    assert after["copies"] - before["copies"] == 1
    torch.cuda.synchronize()
    prefill.assert_equals_the_builders(staged)


@pytest.mark.cuda
@pytest.mark.parametrize("extra_values", [0, 7, UNDER_THE_BOUND, OVER_THE_BOUND, 600_000])
def test_items_of_odd_sizes_and_megabytes_staged_with_the_cache_rows_are_right(rng, extra_values):
    """Items of odd byte counts (no multiple of 16) and, with more values, just under the bound of
    the launch's own copy, just over it or 4.8 MB (the copy engine copies those two, before the
    rows' launch), staged with the cache rows behind a busy stream: every byte of every item and row."""
    prefill = Prefill(rng, 12, "cuda")
    odd = [
        ([rng.randint(-128, 127) for _ in range(13)], torch.int8),
        ([rng.random() < 0.5 for _ in range(5)], torch.bool),
        ([rng.random() for _ in range(3)], torch.float16),
        ([rng.randint(-(1 << 62), 1 << 62) for _ in range(extra_values)], torch.int64),
    ]
    items = prefill.items() + odd
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    (staged, indices), still_busy = run_while_stream_busy(
        lambda: stage_prefill(items, prefill.lens, prefill.starts, prefill.cache_rows(), stream=stream), stream
    )
    assert still_busy, "stage_prefill returned only after the busy stream finished"
    torch.cuda.synchronize()
    for i, ((values, dtype), got) in enumerate(zip(items, staged)):
        assert_same_tensor(got, torch.tensor(values, dtype=dtype, device="cuda"), "item %d" % i)
    assert_fields_equal(indices, build_logprob_indices(prefill.lens, prefill.starts, device="cuda"))
    assert torch.equal(prefill.table.cpu(), prefill.expected_table().cpu()), "req_to_token"


@pytest.mark.cuda
@pytest.mark.parametrize("extra_values, copies", [(UNDER_THE_BOUND, 0), (OVER_THE_BOUND, 1)])
def test_the_copy_engine_copies_only_the_items_over_the_bound(rng, extra_values, copies):
    """Up to _C.PREFILL_BLOCKS_COPY_MAX_BYTES of items the one launch copies them (no host-to-device
    copy on the device's timeline); over it one copy-engine copy comes first. The size cases above
    rely on this to cover both ways."""
    prefill = Prefill(rng, 12, "cuda")
    items = prefill.items() + [(list(range(extra_values)), torch.int64)]

    def run():
        return stage_prefill(items, prefill.lens, prefill.starts, prefill.cache_rows())

    run()  # the kernel's module loaded, the ring made: outside the profile
    torch.cuda.synchronize()
    (staged, _), _, on_device = profiled_on_device(run)
    if not on_device:
        pytest.skip("the profiler records no device activity here (no CUPTI activity)")
    launches = [n for n in on_device if "write_cache_indices_kernel" in n]
    h2d = [n for n in on_device if is_host_to_device_copy(n)]
    assert len(launches) == 1, "stage_prefill's launches: %s" % on_device
    assert len(h2d) == copies, "host-to-device copies of %d extra values: %s" % (extra_values, on_device)
    assert_same_tensor(staged[-1], torch.tensor(items[-1][0], dtype=torch.int64, device="cuda"), "extra values")
    assert torch.equal(prefill.table.cpu(), prefill.expected_table().cpu()), "req_to_token"


@pytest.mark.parametrize("device", DEVICES)
def test_cache_rows_of_no_requests_stage_the_items_and_write_nothing(device):
    table = torch.full((4, MAX_CONTEXT_LEN), SENTINEL, dtype=torch.int32, device=device)
    items = [([], torch.int64), ([3, 1, 4], torch.int32)]
    staged, indices = stage_prefill(items, [], [], CacheRows(table, [], [], [], [], 0), device=device)
    assert_same_tensor(staged[0], torch.tensor([], dtype=torch.int64, device=device), "out_cache_loc")
    assert_same_tensor(staged[1], torch.tensor([3, 1, 4], dtype=torch.int32, device=device), "item 1")
    assert_fields_equal(indices, build_logprob_indices([], [], device=device))
    assert (table == SENTINEL).all(), "req_to_token was written"


@pytest.mark.cuda
def test_bad_cache_rows_stage_nothing_on_the_gpu(rng):
    prefill = Prefill(rng, 8, "cuda")
    rows = list(prefill.rows)
    rows[3] = -1
    cache = prefill.cache_rows()._replace(req_pool_indices=rows)
    items = prefill.items()
    torch.cuda.synchronize()
    before = pinstage.stats()
    with pytest.raises(IndexError, match="request 3: req_pool_indices is -1"):
        stage_prefill(items, prefill.lens, prefill.starts, cache)
    assert pinstage.stats()["copies"] == before["copies"], "a copy was made before the check"
    torch.cuda.synchronize()
    assert (prefill.table == SENTINEL).all()


@pytest.mark.cuda
def test_req_to_token_on_another_device_than_the_items_is_refused(rng):
    prefill = Prefill(rng, 2, "cpu")
    with pytest.raises(ValueError, match="req_to_token is on cpu but the items are staged to cuda"):
        stage_prefill(
            [(prefill.locations, torch.int64)],
            prefill.lens,
            prefill.starts,
            prefill.cache_rows()._replace(out_cache_loc=0),
            device="cuda",
        )


class _RunsWhenConverted:
    """An int whose conversion runs `change()`: Python code run while the items are written, after
    the cache rows were checked."""

    def __init__(self, change):
        self.change = change

    def __index__(self):
        self.change()
        return 1


def _prefill_with_prefixes(rng, device):
    """Four requests, each with a cached prefix of 2 of its prefix tensor's 8 slots."""
    prefill = Prefill(rng, 4, device)
    prefill.prefix_lens = [2] * 4
    prefill.prefixes = [torch.arange(8, device=device) for _ in range(4)]
    prefill.seq_lens = [2 + n for n in prefill.lens]
    return prefill


def _assert_refused_when_converting_runs(prefill, change):
    items = [
        (prefill.ids, torch.int64),
        ([1, 2, _RunsWhenConverted(change)], torch.int64),
        (prefill.locations, torch.int64),
    ]
    with pytest.raises(RuntimeError, match="changed after it was checked"):
        stage_prefill(items, prefill.lens, prefill.starts, prefill.cache_rows())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("target", ["req_to_token", "prefix", "prefix dtype"])
def test_a_table_or_prefix_changed_while_the_items_are_written_is_refused(rng, device, target):
    """Rows checked against the table before the items were written are not written into what it
    became (a smaller table: out of bounds), nor read from a prefix that changed: resized, or the
    same memory and length seen as float64 (its bits are not slots)."""
    prefill = _prefill_with_prefixes(rng, device)
    prefix = prefill.prefixes[1]
    change = {
        "req_to_token": lambda: prefill.table.resize_((1, 2)),
        "prefix": lambda: prefix.resize_((1,)),
        "prefix dtype": lambda: setattr(prefix, "data", prefix.view(torch.float64)),
    }[target]
    _assert_refused_when_converting_runs(prefill, change)
    if target != "req_to_token":
        assert (prefill.table == SENTINEL).all(), "req_to_token was written"


@pytest.mark.cuda
@pytest.mark.parametrize("target", ["req_to_token", "prefix"])
def test_a_storage_remade_smaller_at_the_same_address_is_refused(rng, target):
    """Address, shape and strides unchanged, but the storage no longer holds the tensor: nothing is
    written into or read from past its end. The tensor is the only one of a private pool, so the
    allocator hands its block back when the storage is made again."""
    prefill = _prefill_with_prefixes(rng, "cuda")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        if target == "req_to_token":
            tensor = prefill.table = prefill.table.clone()
        else:
            tensor = prefill.prefixes[1] = torch.arange(8, device="cuda")
    address = tensor.data_ptr()

    def remake_smaller():
        with torch.cuda.use_mem_pool(pool):
            tensor.untyped_storage().resize_(0)
            tensor.untyped_storage().resize_(8)

    _assert_refused_when_converting_runs(prefill, remake_smaller)
    assert tensor.data_ptr() == address, "the storage was remade elsewhere: the case this test is for did not arise"


@pytest.mark.parametrize("device", DEVICES)
def test_prefixes_the_caller_drops_while_the_items_are_written_are_still_read_whole(rng, device):
    """The call reads the prefix tensors it was given, not copies of them: the caller's list emptied
    mid-call (its tensors then owned by the call alone) and their memory handed out again must not
    change what is written."""
    prefill = _prefill_with_prefixes(rng, device)
    prefill.prefixes = [torch.arange(100 * i, 100 * i + 8, device=device) for i in range(4)]
    kept = [p.clone() for p in prefill.prefixes]
    reused = []

    def drop_and_reallocate():
        prefill.prefixes.clear()  # the list CacheRows holds: the call's own tuple keeps the tensors
        reused.extend(torch.full((8,), -1, dtype=torch.int64, device=device) for _ in range(64))

    items = [
        (prefill.ids, torch.int64),
        ([1, 2, _RunsWhenConverted(drop_and_reallocate)], torch.int64),
        (prefill.locations, torch.int64),
    ]
    stage_prefill(items, prefill.lens, prefill.starts, prefill.cache_rows())
    assert reused and not prefill.prefixes, "the conversion did not run the change"
    prefill.prefixes = kept
    assert torch.equal(prefill.table.cpu(), prefill.expected_table().cpu()), "req_to_token"
