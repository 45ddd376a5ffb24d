"""Staging onto the GPU: values, no host/device synchronisation, and the ring's reuse invariant.

The race tests keep the stream busy with torch.cuda._sleep so that every copy is still queued while
the host stages thousands more through a ring of a few KiB: a region written again before its copy
ran would show up as a wrong value once the GPU catches up. Every expectation is torch.tensor's.
"""

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
import torch
from gpu_busy import CYCLES_PER_US, assert_still_busy, busy, captured
from staging_reference import (
    DTYPES,
    NUMPY_OF,
    assert_same_tensor,
    dtype_name,
    expected,
    natural_values,
    seeded_rng,
)
from support import is_host_to_device_copy, profiled_on_device
from threads import run_in_threads

import pinstage

DTYPE_IDS = [dtype_name(d) for d in DTYPES]
# Building numpy inputs from out-of-range doubles (inf by design) makes numpy warn.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
SMALL_RING = 4096
STATS_KEYS = (
    "ring_bytes",
    "in_flight_bytes",
    "peak_in_flight_bytes",
    "calls",
    "bytes_staged",
    "overflows",
    "waits",
    "wraps",
    "events_created",
    "event_records",
    "event_queries",
)


# The device's launch queue holds about a thousand operations; past that the host blocks inside
# the driver until the GPU drains it. Copies queued behind one sleep are therefore kept to a few
# hundred per chunk (each staging queues a copy and possibly an event record).
CHUNK = 300


def issue_in_chunks(requests, records, streams=(None,), sleep_ms=80):
    """Issues requests in chunks, each entirely behind a fresh sleep on every stream, so that every
    ring region of a chunk is still unread while the rest of the chunk is staged. Fails if a sleep
    ended before its chunk was issued (the premise of the race check)."""
    for start in range(0, len(requests), CHUNK):
        torch.cuda.synchronize()
        dones = [busy(sleep_ms, s) for s in streams]
        for i, request in enumerate(requests[start : start + CHUNK]):
            _issue(request, records, streams[i % len(streams)])
        for done in dones:
            assert_still_busy(done, "stagings %d..%d were issued" % (start, start + CHUNK))


def issue_trickling(requests, records, streams=(None,), every=10, sleep_ms=0.5):
    """Issues requests while short sleeps keep the GPU a little behind the host, so that regions
    complete one by one while later ones are still queued: reuse right after completion, next to
    regions still in flight."""
    for i, request in enumerate(requests):
        stream = streams[i % len(streams)]
        if i % every == 0:
            busy(sleep_ms, stream)
        _issue(request, records, stream)


def check_staged(records):
    """records: [(result, data, dtype)], checked against torch.tensor after the GPU caught up."""
    torch.cuda.synchronize()
    for i, (got, data, dtype) in enumerate(records):
        want, exc = expected(data, dtype)
        assert exc is None, "test input %d rejected by torch.tensor: %r" % (i, exc)
        assert got.is_cuda, "result %d on %s" % (i, got.device)
        assert_same_tensor(got, want.cuda(), "staging %d (%s, %d values)" % (i, dtype_name(dtype), want.numel()))


@pytest.fixture(scope="module")
def default_ring_bytes():
    pinstage.stage_to_device([0], torch.int64)
    torch.cuda.synchronize()
    ring = pinstage.stats()["ring_bytes"]
    assert ring > 0
    return ring


@pytest.fixture(autouse=True)
def restore_configuration(default_ring_bytes):
    torch.cuda.synchronize()
    yield
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    pinstage.configure(ring_bytes=default_ring_bytes, on_full="overflow")


def _stats():
    s = pinstage.stats()
    missing = [k for k in STATS_KEYS if k not in s]
    assert not missing, "stats() lacks %s" % missing
    return s


# A mix of dtypes and lengths for the race tests; each call's values are distinct random numbers.
RACE_DTYPES = [
    torch.int64,
    torch.int32,
    torch.float32,
    torch.float64,
    torch.int16,
    torch.uint8,
    torch.bfloat16,
    torch.float16,
    torch.uint64,
    torch.bool,
]


def _race_inputs(count, rng, max_len=64):
    """count staging requests: ("one", data, dtype) or ("many", [(data, dtype), ...])."""
    out = []
    for i in range(count):
        if i % 5 == 4:
            items = []
            for j in range(rng.randint(2, 4)):
                dtype = RACE_DTYPES[(i + j) % len(RACE_DTYPES)]
                items.append((natural_values(dtype, rng.randint(1, max_len), rng), dtype))
            out.append(("many", items))
        else:
            dtype = RACE_DTYPES[i % len(RACE_DTYPES)]
            values = natural_values(dtype, rng.randint(1, max_len), rng)
            # Every third staging copies a numpy array or a CPU tensor (the memcpy paths) instead.
            if i % 3 == 1 and dtype != torch.bfloat16:
                values = np.array(values, dtype=NUMPY_OF[dtype])
            elif i % 3 == 2:
                values = torch.tensor(values, dtype=dtype)
            out.append(("one", values, dtype))
    return out


def _issue(request, records, stream=None):
    if request[0] == "one":
        _, data, dtype = request
        records.append((pinstage.stage_to_device(data, dtype, stream), data, dtype))
    else:
        items = request[1]
        results = pinstage.stage_many(items, stream)
        assert len(results) == len(items)
        records.extend((r, d, t) for r, (d, t) in zip(results, items))


# ---------------------------------------------------------------------------------------------
# Values


def _input(kind, dtype, data):
    if kind == "list":
        return data
    if kind == "numpy":
        return np.array(data, dtype=np.float32 if dtype == torch.bfloat16 else NUMPY_OF[dtype])
    if kind == "tensor":
        return torch.tensor(data, dtype=dtype)
    raise AssertionError(kind)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [0, 1, 7, 256, 4097, pytest.param(1_000_000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matches_torch_tensor(dtype, kind, n):
    values = natural_values(dtype, n, seeded_rng("cuda", dtype_name(dtype), n))
    data = _input(kind, dtype, values)
    want, exc = expected(data, dtype)
    assert exc is None
    got = pinstage.stage_to_device(data, dtype)
    assert got.device == torch.device("cuda", torch.cuda.current_device())
    assert_same_tensor(got, want.cuda(), "%s %s n=%d" % (dtype_name(dtype), kind, n))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nested_and_scalar_inputs(dtype):
    rng = seeded_rng("cuda-nested", dtype_name(dtype))
    for data in (
        [natural_values(dtype, 3, rng) for _ in range(5)],
        [[natural_values(dtype, 2, rng) for _ in range(3)] for _ in range(2)],
        natural_values(dtype, 1, rng)[0],
        range(0),
        [[], []],
        True,
        3,
    ):
        want, exc = expected(data, dtype)
        if exc is not None:
            with pytest.raises(type(exc)):
                pinstage.stage_to_device(data, dtype)
            continue
        got = pinstage.stage_to_device(data, dtype)
        assert got.is_cuda
        assert_same_tensor(got, want.cuda(), "%s %r" % (dtype_name(dtype), data))


@pytest.mark.cuda
def test_conversion_errors_on_cuda_match_torch():
    with pytest.raises(RuntimeError) as info:
        pinstage.stage_to_device([1, 300], torch.uint8)
    message = str(info.value)
    assert "[1]" in message and "300" in message and "uint8" in message, message
    with pytest.raises(ValueError):
        pinstage.stage_to_device([[1, 2], [3]], torch.int64)
    with pytest.raises(OverflowError):
        pinstage.stage_to_device([1, -1], torch.uint64)
    with pytest.raises(TypeError) as info:
        pinstage.stage_to_device([1, 2], torch.complex64)
    assert "complex64" in str(info.value)


# ---------------------------------------------------------------------------------------------
# No synchronisation


@pytest.mark.cuda
def test_no_sync_sets_and_restores_debug_mode():
    before = torch.cuda.get_sync_debug_mode()
    x = torch.ones(4, device="cuda")
    with pinstage.testing.no_sync():
        assert torch.cuda.get_sync_debug_mode() == 2
        with pytest.raises(RuntimeError):
            x.sum().item()  # a synchronising call must raise inside: the detector works
    assert torch.cuda.get_sync_debug_mode() == before
    with pytest.raises(KeyError):
        with pinstage.testing.no_sync():
            raise KeyError("inside")
    assert torch.cuda.get_sync_debug_mode() == before


class _SyncDebugMode:
    """torch's sync debug mode set directly (not through pinstage.testing), restored on exit."""

    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(self.mode)

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self.prev)


@pytest.mark.cuda
@pytest.mark.parametrize("guard", ["testing.no_sync", "set_sync_debug_mode"])
def test_staging_never_synchronises(guard):
    rng = seeded_rng("nosync", guard)
    pinstage.stage_to_device([1], torch.int64)  # any lazy set-up happens outside the guard
    other = torch.cuda.Stream()
    outs = {d: torch.empty(33, dtype=d, device="cuda") for d in DTYPES}
    records = []
    into = []
    done = busy(100)
    busy(100, other)
    with pinstage.testing.no_sync() if guard == "testing.no_sync" else _SyncDebugMode("error"):
        for dtype in DTYPES:
            for n in (0, 1, 16, 300):
                data = natural_values(dtype, n, rng)
                records.append((pinstage.stage_to_device(data, dtype), data, dtype))
            data = natural_values(dtype, 50, rng)
            records.append((pinstage.stage_to_device(data, dtype, other), data, dtype))
            data = natural_values(dtype, 1, rng)[0]
            records.append((pinstage.stage_to_device(data, dtype), data, dtype))
        for _ in range(20):
            _issue(("many", [(natural_values(d, rng.randint(0, 40), rng), d) for d in DTYPES]), records)
        _issue(("many", [(natural_values(torch.int32, 9, rng), torch.int32)]), records, other)
        for dtype, out in outs.items():
            data = natural_values(dtype, 33, rng)
            assert pinstage.stage_into(data, out) is out
            into.append((out, data, dtype))
        assert_still_busy(done, "the stagings returned")
    check_staged(records + into)


# ---------------------------------------------------------------------------------------------
# The ring: no reuse before the copy that read a region has run


@pytest.mark.cuda
def test_no_reuse_race_with_overflow():
    pinstage.configure(ring_bytes=SMALL_RING, on_full="overflow")
    rng = seeded_rng("race-overflow")
    queued = _race_inputs(3000, rng)
    trickled = _race_inputs(2000, rng)
    big = natural_values(torch.int64, 5000, rng)  # larger than the whole ring
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    records = []
    done = busy(100)
    records.append((pinstage.stage_to_device(big, torch.int64), big, torch.int64))
    for request in queued[:CHUNK]:
        _issue(request, records)
    assert_still_busy(done, "the first chunk was issued")
    during = _stats()
    assert during["in_flight_bytes"] > 0, "copies are queued behind a sleeping kernel, yet nothing is in flight"
    assert during["peak_in_flight_bytes"] >= during["in_flight_bytes"]
    # Chunks that pin new overflow blocks (cudaHostAlloc, milliseconds each) outlasted an 80 ms sleep once.
    issue_in_chunks(queued[CHUNK:], records, sleep_ms=300)
    issue_trickling(trickled, records)
    after = _stats()
    check_staged(records)
    assert after["overflows"] > before["overflows"], "a %d-byte ring served %d queued stagings without overflow" % (
        SMALL_RING,
        len(queued),
    )
    assert after["calls"] - before["calls"] == len(queued) + len(trickled) + 1, "calls were lost or double-counted"
    assert after["waits"] == before["waits"], "on_full='overflow' waited"


@pytest.mark.cuda
def test_no_reuse_race_with_wait():
    pinstage.configure(ring_bytes=SMALL_RING, on_full="wait")
    rng = seeded_rng("race-wait")
    requests = _race_inputs(600, rng, max_len=24)
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    records = []
    busy(50)
    for i, request in enumerate(requests):
        if i % 40 == 0:
            busy(2)  # keep copies queued so that the ring keeps filling up behind the GPU
        _issue(request, records)
    after = _stats()
    check_staged(records)
    assert after["waits"] > before["waits"], "a %d-byte ring filled behind a busy GPU without waiting" % SMALL_RING
    assert after["overflows"] == before["overflows"], "on_full='wait' overflowed for requests smaller than the ring"


@pytest.mark.cuda
@pytest.mark.parametrize("on_full", ["wait", "error"])
def test_full_ring_raises_and_keeps_earlier_results(on_full):
    """A full ring behind a busy GPU: on_full="error" raises RingFullError; on_full="wait" must wait,
    which inside no_sync() is an error too. Either way earlier results stay intact and the ring
    serves later calls."""
    pinstage.configure(ring_bytes=SMALL_RING, on_full=on_full)
    rng = seeded_rng("full-ring", on_full)
    records = []
    done = busy(200)
    raised = None
    with pinstage.testing.no_sync():
        for i in range(1000):
            data = natural_values(torch.int32, 8 + i % 20, rng)
            try:
                records.append((pinstage.stage_to_device(data, torch.int32), data, torch.int32))
            except RuntimeError as exc:
                raised = exc
                break
        # Further requests keep failing (not corrupting) while the ring is full.
        with pytest.raises(RuntimeError):
            pinstage.stage_many([([1, 2, 3], torch.int64), ([4.0] * 300, torch.float32)])
    assert raised is not None, "filled a %d-byte ring many times over with the GPU busy, never refused" % SMALL_RING
    if on_full == "error":
        assert isinstance(raised, pinstage.RingFullError), type(raised)
    else:
        assert "synchronisation is an error" in str(raised), raised
    assert records, "the first stagings should have fitted"
    assert_still_busy(done, "the ring filled")
    check_staged(records)
    again = natural_values(torch.int32, 64, rng)
    check_staged([(pinstage.stage_to_device(again, torch.int32), again, torch.int32)])
    assert _stats()["in_flight_bytes"] <= SMALL_RING


@pytest.mark.cuda
def test_a_wait_warning_raised_as_an_error_frees_the_result():
    """Under sync debug mode "warn" a wait for a full ring warns; with warnings as errors the call
    fails after its result tensor exists, and that tensor must be freed, not leaked."""
    pinstage.configure(ring_bytes=SMALL_RING, on_full="wait")
    data = list(range(256))  # 2 KiB: smaller than the ring, so a full ring waits
    pinstage.stage_to_device(data, torch.int64)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    busy(200)
    with _SyncDebugMode("warn"), warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="must wait for an in-flight copy"):
            for _ in range(4):  # two fit in the ring; the third waits
                pinstage.stage_to_device(data, torch.int64)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base, "a result was leaked"


@pytest.mark.cuda
@pytest.mark.parametrize("ring", [None, SMALL_RING], ids=["default_ring", "small_ring"])
def test_failed_calls_leave_ring_and_results_intact(ring):
    if ring:
        pinstage.configure(ring_bytes=ring)
    rng = seeded_rng("failed", ring)
    records = []
    # Long: with the small ring nearly every staging overflows, and each new overflow block is a
    # cudaHostAlloc, whose time varies from run to run.
    done = busy(400)
    for request in _race_inputs(100, rng):
        _issue(request, records)
    failures = [
        lambda: pinstage.stage_to_device(list(range(200)) * 5 + [300], torch.uint8),
        lambda: pinstage.stage_to_device([1.0] * 100 + [None], torch.float32),
        lambda: pinstage.stage_to_device([[1, 2]] * 50 + [[3]], torch.int64),
        lambda: pinstage.stage_many([([1] * 100, torch.int64), ([1, 2**70], torch.int64)]),
        lambda: pinstage.stage_many([([1] * 10, torch.int64), ([1], torch.complex64)]),
    ]
    for fail in failures * 20:
        with pytest.raises((RuntimeError, TypeError, ValueError, OverflowError)):
            fail()
    for request in _race_inputs(100, rng):
        _issue(request, records)
    assert_still_busy(done, "the stagings and failures were issued")
    check_staged(records)

    # A leaked reservation would shrink the ring for good: with the GPU idle, a request of most of
    # the ring must still fit after many failed calls.
    pinstage.configure(ring_bytes=SMALL_RING)
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    for fail in failures * 20:
        with pytest.raises((RuntimeError, TypeError, ValueError, OverflowError)):
            fail()
    torch.cuda.synchronize()
    data = natural_values(torch.uint8, SMALL_RING * 3 // 4, rng)
    check_staged([(pinstage.stage_to_device(data, torch.uint8), data, torch.uint8)])
    after = _stats()
    assert after["overflows"] == before["overflows"], "failed calls leaked ring space"
    assert after["in_flight_bytes"] <= SMALL_RING


# ---------------------------------------------------------------------------------------------
# Streams and threads


@pytest.mark.cuda
def test_stage_on_non_current_stream():
    rng = seeded_rng("other-stream")
    side = torch.cuda.Stream()
    data = [rng.randint(-(2**62), 2**62) for _ in range(512)]
    torch.cuda.synchronize()
    side_done = busy(200, side)
    got = pinstage.stage_to_device(data, torch.int64, side)
    assert got.is_cuda
    # Read the result on the (idle) current stream right away: the copy is queued behind the side
    # stream's sleep, so the values must not be there yet. Random 64-bit values cannot be there by chance.
    early = got.clone()
    current_done = torch.cuda.Event()
    current_done.record()
    current_done.synchronize()
    assert not side_done.query(), "staging onto a side stream made the current stream wait for it"
    assert not torch.equal(early.cpu(), torch.tensor(data)), "the copy ran on the current stream, not the given one"
    side.synchronize()
    assert_same_tensor(got, torch.tensor(data).cuda(), "staged on a side stream")

    # With the side stream current, stream=None means the side stream; stage_into takes stream= too.
    with torch.cuda.stream(side):
        busy(20)
        got2 = pinstage.stage_to_device(data[:100], torch.int64)
        out = torch.empty(100, dtype=torch.int64, device="cuda")
        pinstage.stage_into(data[100:200], out, side)
        many = pinstage.stage_many([(data[:7], torch.int64), (data[7:9], torch.int64)], side)
    side.synchronize()
    assert_same_tensor(got2, torch.tensor(data[:100]).cuda(), "current side stream")
    assert_same_tensor(out, torch.tensor(data[100:200]).cuda(), "stage_into on a side stream")
    assert_same_tensor(many[1], torch.tensor(data[7:9]).cuda(), "stage_many on a side stream")


@pytest.mark.cuda
def test_two_busy_streams_interleaved():
    pinstage.configure(ring_bytes=SMALL_RING)
    rng = seeded_rng("two-streams")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    records = []
    issue_in_chunks(_race_inputs(1800, rng), records, streams)
    issue_trickling(_race_inputs(1200, rng), records, streams)
    check_staged(records)


@pytest.mark.cuda
@pytest.mark.parametrize("ring", [None, SMALL_RING], ids=["default_ring", "small_ring"])
@pytest.mark.parametrize("same_stream", [True, False], ids=["same_stream", "own_streams"])
def test_two_threads_staging_at_once(same_stream, ring):
    if ring:
        pinstage.configure(ring_bytes=ring)
    per_thread = 2000
    inputs = [_race_inputs(per_thread, seeded_rng("threads", t, same_stream, ring)) for t in range(2)]
    streams = [torch.cuda.current_stream()] * 2 if same_stream else [torch.cuda.Stream(), torch.cuda.Stream()]
    records = [[], []]
    start = threading.Barrier(2)
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()
    before = _stats()

    def work(t):
        with torch.cuda.stream(streams[t]):
            start.wait()
            for i, request in enumerate(inputs[t]):
                if i % 500 == 0:
                    busy(20)
                _issue(request, records[t])

    run_in_threads(work, 2, timeout=300)
    after = _stats()
    assert after["calls"] - before["calls"] == 2 * per_thread, "calls were lost or double-counted across threads"
    check_staged(records[0] + records[1])


# ---------------------------------------------------------------------------------------------
# CUDA graphs


@pytest.mark.cuda
def test_staging_during_capture_raises():
    static = torch.zeros(4, dtype=torch.int64, device="cuda")
    capture_stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=capture_stream):
        y = static + 1
        with pytest.raises(RuntimeError, match="(?i)captur"):
            pinstage.stage_to_device([1, 2, 3], torch.int64)
        with pytest.raises(RuntimeError, match="(?i)captur"):
            pinstage.stage_to_device([1, 2, 3], torch.int64, capture_stream)
        with pytest.raises(RuntimeError, match="(?i)captur"):
            pinstage.stage_many([([1], torch.int64), ([2.0], torch.float32)])
        with pytest.raises(RuntimeError, match="(?i)captur"):
            pinstage.stage_into([5, 6, 7, 8], static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.ones(4, dtype=torch.int64)), "the capture was disturbed"
    assert torch.equal(static.cpu(), torch.zeros(4, dtype=torch.int64)), "stage_into wrote during capture"
    got = pinstage.stage_to_device([1, 2, 3], torch.int64)
    assert torch.equal(got.cpu(), torch.tensor([1, 2, 3])), "staging broken after a refused capture"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16], ids=dtype_name)
def test_stage_into_feeds_captured_graph(dtype):
    n = 257
    rng = seeded_rng("graph", dtype_name(dtype))
    static = torch.zeros(n, dtype=dtype, device="cuda")
    graph, out = captured(lambda: static * 2 + 1)

    # |x| <= 127 keeps x * 2 + 1 exact in every dtype here, bfloat16 included.
    rounds = [
        [float(rng.randint(-127, 127)) if dtype.is_floating_point else rng.randint(-127, 127) for _ in range(n)]
        for _ in range(12)
    ]
    results = []
    done = busy(100)
    for data in rounds:
        assert pinstage.stage_into(data, static) is static
        graph.replay()
        results.append(out.clone())
    assert_still_busy(done, "the replays were queued")
    torch.cuda.synchronize()
    for k, (data, got) in enumerate(zip(rounds, results)):
        assert_same_tensor(got, (torch.tensor(data, dtype=dtype) * 2 + 1).cuda(), "replay %d" % k)


@pytest.mark.cuda
def test_stage_into_checks_its_target():
    out = torch.full((4,), 9, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError):
        pinstage.stage_into([1, 2, 3], out)
    with pytest.raises(ValueError):
        pinstage.stage_into([1, 2, 3, 4, 5], out)
    with pytest.raises(TypeError):
        pinstage.stage_into([1, 2, 3, 4], torch.empty(4, dtype=torch.complex64, device="cuda"))
    with pytest.raises(RuntimeError):
        pinstage.stage_into([1, 2, 3, 300], torch.zeros(4, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((4,), 9, dtype=torch.int64)), "a refused stage_into wrote into out"
    grid = torch.empty(2, 3, dtype=torch.float32, device="cuda")
    pinstage.stage_into([[1, 2, 3], [4, 5, 6]], grid)
    assert torch.equal(grid.cpu(), torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# Process exit with copies in flight


_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, torch, pinstage
    ring, keep = int(sys.argv[1]), sys.argv[2] == "keep"
    if ring:
        pinstage.configure(ring_bytes=ring)
    pinstage.stage_to_device([0], torch.int64)
    torch.cuda._sleep(int(2e6 * %d))
    done = torch.cuda.Event()
    done.record()
    kept = []
    for i in range(150):  # within the device's launch queue, so that the host never blocks in it
        t = pinstage.stage_to_device(list(range(i, i + 64)), torch.int64)
        m = pinstage.stage_many([(list(range(i, i + 8)), torch.int32), ([1.5] * 5, torch.float32)])
        if keep:
            kept.append((t, m))
    print("issued", not done.query(), flush=True)
    """
    % CYCLES_PER_US
)


@pytest.mark.cuda
@pytest.mark.parametrize("keep", ["keep", "drop"])
@pytest.mark.parametrize("ring", [0, SMALL_RING], ids=["default_ring", "small_ring"])
def test_exit_with_copies_in_flight(ring, keep):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pinstage.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(ring), keep], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s" % (
        proc.returncode,
        proc.stdout,
        proc.stderr[-4000:],
    )
    assert "issued True" in proc.stdout, "the copies were not in flight at exit: %r" % proc.stdout


# ---------------------------------------------------------------------------------------------
# stage_many


def _many_items(rng):
    return [
        (natural_values(torch.int64, 33, rng), torch.int64),
        (natural_values(torch.float32, 7, rng), torch.float32),
        ([natural_values(torch.int32, 3, rng) for _ in range(4)], torch.int32),
        (natural_values(torch.bool, 5, rng), torch.bool),
        (natural_values(torch.float16, 9, rng), torch.float16),
        (natural_values(torch.uint64, 3, rng), torch.uint64),
        (natural_values(torch.int8, 1, rng), torch.int8),
        (natural_values(torch.float64, 2, rng)[0], torch.float64),
        (natural_values(torch.bfloat16, 11, rng), torch.bfloat16),
    ]


@pytest.mark.cuda
def test_stage_many_is_one_allocation_of_disjoint_views():
    rng = seeded_rng("many-views")
    items = _many_items(rng)
    pinstage.stage_to_device([1], torch.int64)
    before = _stats()
    results = pinstage.stage_many(items)
    after = _stats()
    assert after["calls"] - before["calls"] == 1, "stage_many counted as %d calls" % (after["calls"] - before["calls"])
    payload = sum(torch.tensor(d, dtype=t).nbytes for d, t in items)
    assert after["bytes_staged"] - before["bytes_staged"] >= payload
    assert after["copies"] - before["copies"] == 1, "stage_many made %d copies" % (after["copies"] - before["copies"])
    check_staged([(r, d, t) for r, (d, t) in zip(results, items)])
    bases = {r.untyped_storage().data_ptr() for r in results}
    assert len(bases) == 1, "stage_many results live in %d allocations" % len(bases)
    for r in results:
        assert r.data_ptr() % r.element_size() == 0, "misaligned view"
    # The views must not overlap: overwriting one leaves the others as they were.
    snapshot = [r.clone() for r in results]
    results[0].fill_(-1)
    results[3].fill_(False)
    for i, (r, s) in enumerate(zip(results, snapshot)):
        if i not in (0, 3):
            assert_same_tensor(r, s, "item %d after writing items 0 and 3" % i)


@pytest.mark.cuda
def test_stage_many_enqueues_one_copy():
    rng = seeded_rng("many-copy")
    items = _many_items(rng)
    singles = [natural_values(torch.int64, 20, rng) for _ in range(3)]
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()

    def host_to_device_copies(fn):
        _, names, on_device = profiled_on_device(fn)
        return sum(1 for n in on_device if is_host_to_device_copy(n)), names

    three, names = host_to_device_copies(lambda: [pinstage.stage_to_device(s, torch.int64) for s in singles])
    if three == 0:
        pytest.skip("the profiler records no device copies here (no CUPTI activity)")
    assert three == 3, "three stage_to_device calls made %d host-to-device copies" % three
    one, names = host_to_device_copies(lambda: pinstage.stage_many(items))
    assert one == 1, "stage_many of %d items made %d host-to-device copies" % (len(items), one)
    assert any("stage" in n.lower() for n in names), "no named range for the staging call in the profiler"


# ---------------------------------------------------------------------------------------------
# Host time, stats, events, devices


@pytest.mark.cuda
def test_host_never_waits_for_a_busy_gpu():
    # 400 copies stay within the device's launch queue, which would otherwise block the host.
    data = [list(range(i, i + 16)) for i in range(400)]
    for d in data[:100]:
        pinstage.stage_to_device(d, torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    kept = []
    done = busy(50)
    for d in data:
        kept.append(pinstage.stage_to_device(d, torch.int64))
    still_busy = not done.query()
    after = _stats()
    assert still_busy, "400 stagings returned only after the kernel queued before them had finished"
    assert after["waits"] == before["waits"] and after["overflows"] == before["overflows"]
    check_staged([(k, d, torch.int64) for k, d in zip(kept, data)])


@pytest.mark.cuda
def test_stats_account_for_calls_and_bytes():
    s = _stats()
    for k in STATS_KEYS:
        assert isinstance(s[k], int) and s[k] >= 0, "stats()[%r] = %r" % (k, s[k])
    pinstage.configure(ring_bytes=1 << 17)
    data = list(range(1000))
    pinstage.stage_to_device([1], torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    assert (1 << 17) <= before["ring_bytes"] < (1 << 18), "configure(ring_bytes=131072) gave %d" % before["ring_bytes"]
    done = busy(100)
    kept = [pinstage.stage_to_device(data, torch.int64) for _ in range(10)]
    during = _stats()
    assert_still_busy(done, "ten stagings")
    assert during["calls"] - before["calls"] == 10
    assert during["bytes_staged"] - before["bytes_staged"] >= 10 * 8000
    assert during["in_flight_bytes"] >= 10 * 8000, (
        "in_flight_bytes %d with 80000 bytes queued" % during["in_flight_bytes"]
    )
    assert during["peak_in_flight_bytes"] >= during["in_flight_bytes"]
    torch.cuda.synchronize()
    pinstage.stage_to_device([1, 2], torch.int64)
    settled = _stats()
    assert settled["in_flight_bytes"] <= 4096, "in_flight_bytes %d after synchronize" % settled["in_flight_bytes"]
    assert settled["peak_in_flight_bytes"] >= during["in_flight_bytes"]
    check_staged([(k, data, torch.int64) for k in kept])


@pytest.mark.cuda
def test_ring_wraps_around_a_region_still_in_flight():
    """Front regions done, a later one still being copied, and a request that no longer fits
    behind it: the ring must wrap to its start (not overflow, not overwrite the busy region)."""
    pinstage.configure(ring_bytes=16384)  # a fresh ring: its next region starts at offset 0
    rng = seeded_rng("wraps")
    idle, sleeping = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    before = _stats()
    ring = before["ring_bytes"]
    assert 16384 <= ring <= 20480, "configure(ring_bytes=16384) gave %d; the sizes below assume ~16 KiB" % ring
    records = []
    for _ in range(10):  # 10 x 1 KiB at the front, copied at once on an idle stream
        data = natural_values(torch.int64, 128, rng)
        records.append((pinstage.stage_to_device(data, torch.int64, idle), data, torch.int64))
    done = busy(100, sleeping)
    held = natural_values(torch.int64, 256, rng)  # 2 KiB at about 10-12 KiB, held by the sleep
    records.append((pinstage.stage_to_device(held, torch.int64, sleeping), held, torch.int64))
    idle.synchronize()
    # 1 KiB more than the room left behind the held region (which ends at 12 KiB), and no more than
    # the 10 KiB freed in front of it.
    tail = natural_values(torch.int64, (ring - 12288 + 1024) // 8, rng)
    records.append((pinstage.stage_to_device(tail, torch.int64, idle), tail, torch.int64))
    after = _stats()
    assert_still_busy(done, "the wrapping request was staged")
    torch.cuda.synchronize()
    check_staged(records)
    assert after["wraps"] == before["wraps"] + 1, "the ring did not wrap (%d -> %d)" % (before["wraps"], after["wraps"])
    assert after["overflows"] == before["overflows"], "the ring overflowed although its front was free"


@pytest.mark.cuda
def test_no_events_created_in_steady_state():
    data = [list(range(i, i + 32)) for i in range(100)]
    counts = []
    for _ in range(12):
        busy(20)
        kept = [pinstage.stage_to_device(d, torch.int64) for d in data]
        torch.cuda.synchronize()
        counts.append(_stats()["events_created"])
    assert counts[0] > 0, "events_created never counted an event"
    assert counts[-1] == counts[2], "events created in steady state: %s" % counts
    check_staged([(k, d, torch.int64) for k, d in zip(kept, data)])


@pytest.mark.cuda
def test_an_idle_gpu_costs_one_event_query_per_fence_not_per_region():
    """With the GPU idle every fence is done when the ring reclaims: the 32 regions behind one fence
    are released after one cudaEventQuery. Asking once per region made an idle staging cost about
    one query (~2 us on the H200) more than a busy one."""
    data = [list(range(i, i + 16)) for i in range(32)]
    pinstage.stage_to_device(data[0], torch.int64)
    torch.cuda.synchronize()
    before = _stats()
    calls, rounds = 0, 20
    for _ in range(rounds):
        for d in data:
            pinstage.stage_to_device(d, torch.int64)
            calls += 1
        torch.cuda.synchronize()  # idle: every fence recorded so far is done at the next reclaim
    after = _stats()
    queries = after["event_queries"] - before["event_queries"]
    records = after["event_records"] - before["event_records"]
    assert records >= calls // 32 - 1, (records, calls)
    # About one query per fence, never one per region: a round may also ask once about a fence whose
    # copy went out microseconds before ("not ready"), and the snapshot in _stats() once more.
    assert queries <= records + rounds + 2, "%d cudaEventQuery for %d fences over %d stagings" % (
        queries,
        records,
        calls,
    )


@pytest.mark.cuda
def test_device_resolution():
    here = torch.device("cuda", torch.cuda.current_device())
    assert pinstage.stage_to_device([1], torch.int64).device == here
    assert pinstage.stage_to_device([1], torch.int64, device="cuda").device == here
    assert pinstage.stage_to_device([1], torch.int64, device=here).device == here
    cpu = pinstage.stage_to_device([1, 2], torch.int64, device="cpu")
    assert cpu.device.type == "cpu" and not cpu.is_pinned()
    assert torch.equal(cpu, torch.tensor([1, 2]))
    many = pinstage.stage_many([([1], torch.int64), ([2.5], torch.float32)], device="cpu")
    assert [m.device.type for m in many] == ["cpu", "cpu"]
    stream = torch.cuda.Stream()
    assert pinstage.stage_to_device([1], torch.int64, stream).device == stream.device


@pytest.mark.cuda
@pytest.mark.cuda(devices=2)
def test_stream_device_wins_over_current_device():
    with torch.cuda.device(0):
        stream = torch.cuda.Stream(device=1)
        got = pinstage.stage_to_device([1, 2, 3], torch.int64, stream)
        assert got.device == torch.device("cuda", 1)
        on1 = pinstage.stage_to_device([4, 5], torch.int64, device="cuda:1")
        assert on1.device == torch.device("cuda", 1)
    torch.cuda.synchronize(1)
    assert torch.equal(got.cpu(), torch.tensor([1, 2, 3]))
    assert torch.equal(on1.cpu(), torch.tensor([4, 5]))
    assert pinstage.stats(device=1)["calls"] >= 2


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_inputs(dtype):
    inputs = [[], (), [[], []], range(0), np.zeros((0, 3)), [[[]]]]
    with pinstage.testing.no_sync():
        results = [pinstage.stage_to_device(d, dtype) for d in inputs]
        many = pinstage.stage_many([(d, dtype) for d in inputs])
    for got, data in zip(results + many, inputs + inputs):
        want, exc = expected(data, dtype)
        assert exc is None
        assert got.is_cuda, got.device
        assert_same_tensor(got, want.cuda(), "empty %r" % (data,))
