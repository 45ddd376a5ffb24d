"""Two GPUs: a ring per device, results on the device the stream or `device=` names, the current
device left as it was, and no value corrupted when both devices' rings wrap at once."""

import numpy as np
import pytest
import torch
from threads import run_in_threads

import pinstage
from pinstage.builders import BatchState, Request, build_decode_inputs, write_cache_indices

SMALL_RING = 4096
DEVICES = [torch.device("cuda", 0), torch.device("cuda", 1)]


@pytest.fixture(autouse=True)
def small_rings():
    for d in DEVICES:
        torch.cuda.synchronize(d)
    pinstage.configure(ring_bytes=SMALL_RING)
    yield
    for d in DEVICES:
        torch.cuda.synchronize(d)
    pinstage.configure(ring_bytes=8 << 20)


def busy(device):
    with torch.cuda.device(device):
        torch.cuda._sleep(50_000_000)


def stage_batch(device, base, count, stream=None):
    """count stagings of distinct values onto `device` (through `stream` if given); returns
    (result, expected) pairs."""
    out = []
    for i in range(count):
        values = np.arange(base + 100 * i, base + 100 * i + 60, dtype=np.int64)
        if i % 3 == 0:
            got = pinstage.stage_to_device(values.tolist(), torch.int64, stream, device=None if stream else device)
        elif i % 3 == 1:
            got = pinstage.stage_many(
                [(values, torch.int64), (values[:7].astype(np.int32), torch.int32)],
                stream,
                device=None if stream else device,
            )[0]
        else:
            got = torch.empty(60, dtype=torch.int64, device=device)
            pinstage.stage_into(values, got, stream)
        assert got.device == device, (got.device, device)
        out.append((got, values))
    return out


def check(pairs):
    for d in DEVICES:
        torch.cuda.synchronize(d)
    for got, values in pairs:
        assert np.array_equal(got.cpu().numpy(), values)


@pytest.mark.cuda(devices=2)
def test_one_thread_stages_to_both_devices_with_both_rings_wrapping():
    with torch.cuda.device(0):
        before = [pinstage.stats(device=d) for d in DEVICES]
        busy(DEVICES[0])
        busy(DEVICES[1])
        pairs = []
        for round_ in range(20):
            for d in DEVICES:
                pairs += stage_batch(d, 10**6 * d.index + 10**4 * round_, 6)
        assert torch.cuda.current_device() == 0
    check(pairs)
    after = [pinstage.stats(device=d) for d in DEVICES]
    for b, a in zip(before, after):
        assert a["calls"] - b["calls"] == 20 * 6
        assert a["overflows"] + a["wraps"] > b["overflows"] + b["wraps"], "the small ring never filled"
        torch.cuda.synchronize()
    assert all(pinstage.stats(device=d)["in_flight_bytes"] == 0 for d in DEVICES)


@pytest.mark.cuda(devices=2)
@pytest.mark.parametrize("layout", ["one_thread_per_device", "both_threads_both_devices"])
def test_two_threads_stage_at_once(layout):
    pairs = []

    def work(thread):
        targets = [DEVICES[thread]] if layout == "one_thread_per_device" else DEVICES
        streams = {d: torch.cuda.Stream(device=d) for d in targets}
        for d, s in streams.items():
            with torch.cuda.stream(s):
                busy(d)
        for round_ in range(30):
            for d in targets:
                pairs.extend(stage_batch(d, 10**7 * thread + 10**5 * d.index + 10**3 * round_, 4, streams[d]))

    run_in_threads(work, 2, timeout=120)
    check(pairs)


@pytest.mark.cuda(devices=2)
def test_the_named_device_wins_and_the_current_device_is_unchanged():
    with torch.cuda.device(0):
        stream1 = torch.cuda.Stream(device=1)
        a = pinstage.stage_to_device([1, 2], torch.int64, stream1)
        b = pinstage.stage_many([([3], torch.int64), ([4.5], torch.float32)], device="cuda:1")
        out = torch.zeros(3, device="cuda:1")
        pinstage.stage_into([7, 8, 9], out)
        requests = [Request([5, 6], [7], req_pool_idx=0), Request([8], req_pool_idx=1)]
        inputs = build_decode_inputs(requests, device=DEVICES[1])
        state = BatchState()
        for r in requests:
            state.add(r)
        state_inputs = state.decode_inputs(stream=stream1)
        table = torch.zeros((2, 8), dtype=torch.int32, device="cuda:1")
        prefix = torch.tensor([11, 12], dtype=torch.int64, device="cuda:1")
        write_cache_indices(
            table, [1], [prefix], [2], [4], [2], torch.tensor([13, 14], device="cuda:1"), stream=stream1
        )
        fetched = pinstage.fetch_to_host(torch.arange(5, device="cuda:1"), stream1)
        assert torch.cuda.current_device() == 0
    for t in [a, *b, out, inputs.input_ids, state_inputs.seq_lens, table]:
        assert t.device == DEVICES[1], t.device
    torch.cuda.synchronize(1)
    assert a.tolist() == [1, 2] and b[1].tolist() == [4.5] and out.tolist() == [7.0, 8.0, 9.0]
    assert inputs.input_ids.tolist() == [7, 8] and state_inputs.seq_lens.tolist() == [3, 1]
    assert table[1, :4].tolist() == [11, 12, 13, 14]
    assert fetched.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="stream is on cuda:1"):
        pinstage.stage_to_device([1], torch.int64, stream1, device="cuda:0")


@pytest.mark.cuda(devices=2)
def test_fetches_from_both_devices_while_their_rings_wrap():
    handles = []
    for round_ in range(40):
        for d in DEVICES:
            src = torch.full((100,), 1000 * d.index + round_, dtype=torch.int64, device=d)
            handles.append((pinstage.fetch_to_host(src), 1000 * d.index + round_))
    for h, value in handles:
        assert h.tolist() == [value] * 100
    stats = [pinstage.stats(device=d) for d in DEVICES]
    assert all(s["fetches"] >= 40 for s in stats), stats
