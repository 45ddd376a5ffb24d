"""The ring's allocation rules, driven with completion markers the test controls (no GPU needed).

The CUDA ring uses the same RingAllocator template with CUDA events as its fences, so these rules
(alignment, wraparound, no reuse before completion, in-order release, counters) are the ones the
device path runs.
"""

import os
import random

import pytest
from support import ROOT, run_child
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def _build_extension():
    """The test-only extension around RingAllocator, built once per checkout (cached in tests/.build)."""
    build_dir = os.path.join(HERE, ".build", "ring_allocator_ext")
    os.makedirs(build_dir, exist_ok=True)
    return cpp_extension.load(
        name="ring_allocator_ext",
        sources=[os.path.join(HERE, "ring_allocator_ext.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc")],
        extra_cflags=["-O1", "-g0"],
        build_directory=build_dir,
        verbose=False,
    )


Ring = _build_extension().RingAllocator


def test_reservations_are_aligned_and_consecutive():
    ring = Ring(1024)
    offsets = []
    for i, size in enumerate([3, 5, 16, 1, 40]):
        offset, ticket = ring.reserve(size, 16)
        assert offset % 16 == 0
        assert ticket == i
        offsets.append((offset, size))
    for (a, n), (b, _) in zip(offsets, offsets[1:]):
        assert b >= a + n  # no overlap, in order
    assert offsets[0][0] == 0


def test_no_room_until_the_oldest_copy_completes_then_wraps_to_the_front():
    ring = Ring(256)
    first = ring.reserve(100, 16)
    second = ring.reserve(100, 16)
    assert first == (0, 0) and second == (112, 1)
    ring.seal(0, marker=10)
    ring.seal(1, marker=11)
    # 212 bytes held; 44 free at the end, none at the front: 50 bytes do not fit anywhere.
    assert ring.reserve(50, 16) is None
    assert ring.release_completed() == 0  # nothing completed
    ring.complete(10)
    assert ring.release_completed() == 1
    offset, _ = ring.reserve(50, 16)
    assert offset == 0  # wrapped past the unused end
    assert ring.wraps == 1


def test_completed_region_behind_a_pending_one_is_not_released():
    ring = Ring(256)
    _, a = ring.reserve(64, 16)
    _, b = ring.reserve(64, 16)
    ring.seal(a, marker=1)
    ring.seal(b, marker=2)
    ring.complete(2)  # the newer copy finished first (another stream)
    assert ring.release_completed() == 0
    assert ring.pending_regions == 2
    ring.complete(1)
    assert ring.release_completed() == 2
    assert ring.in_flight_bytes == 0


def test_region_being_written_blocks_release_and_abandon_frees_it():
    ring = Ring(256)
    _, writing = ring.reserve(64, 16)  # not sealed: its writer has not enqueued a copy yet
    _, sealed = ring.reserve(64, 16)
    ring.seal(sealed, marker=5)
    ring.complete(5)
    assert ring.release_completed() == 0
    assert ring.oldest_marker() is None  # nothing to wait on while the oldest is being written
    ring.abandon(writing)  # its writer failed: nothing will ever read it
    assert ring.release_completed() == 2
    assert ring.in_flight_bytes == 0


def test_oversized_and_empty_requests_are_refused():
    ring = Ring(128)
    assert ring.reserve(129, 16) is None
    assert ring.reserve(0, 16) is None
    assert ring.reserve(128, 16) == (0, 0)  # exactly the capacity fits an empty ring
    assert ring.reserve(1, 16) is None  # and leaves nothing


def test_counters_track_bytes_held_including_padding_and_the_peak():
    ring = Ring(1000)
    _, t0 = ring.reserve(10, 16)
    _, t1 = ring.reserve(10, 16)  # at 16: 6 bytes of padding belong to this region
    assert ring.in_flight_bytes == 26
    assert ring.peak_in_flight_bytes == 26
    ring.seal(t0, 0)
    ring.seal(t1, 1)
    ring.complete(0)
    ring.complete(1)
    ring.release_completed()
    assert ring.in_flight_bytes == 0
    assert ring.peak_in_flight_bytes == 26


def test_unknown_ticket_is_an_error():
    ring = Ring(128)
    with pytest.raises(RuntimeError, match="unknown or already released ticket"):
        ring.seal(5, 1)


@pytest.mark.parametrize("seed", range(8))
def test_random_schedule_never_hands_out_bytes_an_incomplete_copy_reads(seed):
    """A random mix of reservations, out-of-order completions, abandons and releases. Every byte the
    allocator hands out must not belong to a region whose copy has not completed."""
    rng = random.Random(seed)
    capacity = rng.choice([256, 1000, 4096])
    ring = Ring(capacity)
    live = {}  # ticket -> (offset, size, marker or None); regions the allocator has not released
    done_markers = set()
    abandoned = set()
    next_marker = 0
    order = []  # tickets in reservation order, for modelling in-order release
    handed_out = 0
    for _ in range(3000):
        action = rng.random()
        if action < 0.5:
            size = rng.randint(1, capacity // 3)
            align = rng.choice([1, 8, 16, 64])
            r = ring.reserve(size, align)
            if r is None:
                continue
            offset, ticket = r
            assert offset % align == 0
            assert offset + size <= capacity
            for t, (o, n, marker) in live.items():
                still_read = t not in abandoned and (marker is None or marker not in done_markers)
                overlaps = offset < o + n and o < offset + size
                assert not (still_read and overlaps), "reused bytes of an in-flight region"
                # Stronger: the allocator releases in order, so no live region may overlap at all.
                assert not overlaps
            live[ticket] = (offset, size, None)
            order.append(ticket)
            handed_out += 1
        elif action < 0.75:
            unsealed = [t for t, v in live.items() if v[2] is None and t not in abandoned]
            if unsealed:
                t = rng.choice(unsealed)
                if rng.random() < 0.1:
                    ring.abandon(t)
                    abandoned.add(t)
                else:
                    ring.seal(t, next_marker)
                    live[t] = (live[t][0], live[t][1], next_marker)
                    next_marker += 1
        elif action < 0.9:
            pending = [v[2] for v in live.values() if v[2] is not None and v[2] not in done_markers]
            if pending:
                marker = rng.choice(pending)
                ring.complete(marker)
                done_markers.add(marker)
        else:
            released = ring.release_completed()
            # Model: release pops the oldest while abandoned or sealed-and-done.
            expected = 0
            while order:
                t = order[0]
                o, n, marker = live[t]
                if t in abandoned or (marker is not None and marker in done_markers):
                    del live[t]
                    order.pop(0)
                    expected += 1
                else:
                    break
            assert released == expected
    assert handed_out > 100  # the schedule exercised the allocator
    held = sum(1 for _ in live)
    assert ring.pending_regions == held


def _fill_and_drain(ring, size, times):
    """Reserves `size` bytes `times` times (16-byte aligned), each copy completed and released before
    the next one."""
    for marker in range(times):
        _, ticket = ring.reserve(size, 16)
        ring.seal(ticket, marker)
        ring.complete(marker)
        assert ring.release_completed() == 1


def test_wraps_count_every_pass_over_a_ring_that_drains_between_uses():
    """stats()['wraps'] is documented as the times the ring wrapped to its start: a 4 KiB ring reused
    50 times must count its passes, also when it drains between uses and when a region ends exactly
    at the end, and a restart for the whole capacity is one wrap, not two."""
    whole = Ring(4096)
    _fill_and_drain(whole, 4096, 50)  # every region ends exactly at the end
    assert whole.wraps == 50
    parts = Ring(4096)
    _fill_and_drain(parts, 1000, 50)  # 1008 bytes apart: 4 to a pass, the 5th restarts at the front
    assert parts.wraps == 12
    restart = Ring(4096)
    _fill_and_drain(restart, 1000, 1)
    _fill_and_drain(restart, 4096, 1)  # the head moves to the front and the region ends at the end
    assert restart.wraps == 1


def test_a_full_ring_offers_to_wait_only_for_a_region_that_can_complete_on_its_own():
    """Waiting (on_full="wait") for a region still being written or held by a reader could wait
    forever: its writer may be the waiter itself, re-entered from a conversion callback, or a thread
    that waits for the waiter. Only a sealed, unheld region is offered."""
    ring = Ring(256)
    _, first = ring.reserve(128, 16)
    _, second = ring.reserve(128, 16)
    assert ring.reserve(16, 16) is None  # full
    assert ring.oldest_marker() is None  # the oldest is still being written
    ring.seal(first, marker=1, held=True)
    ring.seal(second, marker=2)
    assert ring.oldest_marker() is None  # sealed, but a reader holds it: its fence cannot free it
    ring.unhold(first)
    assert ring.oldest_marker() == 1
    ring.complete(1)
    assert ring.release_completed() == 1
    assert ring.oldest_marker() == 2


# A child process: its rings are fresh. The sleep (about 0.5 s) shows whether a call waited for the device.
RESIZED_BEFORE_AND_AFTER_PINNING = """
import torch, pinstage
pinstage.configure(ring_bytes=1 << 16, device=0)  # makes the device's rings, pinning nothing
torch.cuda._sleep(10**9)
done = torch.cuda.Event()
done.record()
pinstage.configure(ring_bytes=1 << 17, device=0)  # an unpinned slab: replaced, nothing to free
pinstage.empty_cache(0)
assert not done.query(), "configure() or empty_cache() waited for the device with no pinned memory to free"
s = pinstage.stats(0)
assert not s["ring_allocated"] and (1 << 17) <= s["ring_bytes"] < (1 << 18), s
first = pinstage.stage_to_device(list(range(1000)), torch.int64)
assert pinstage.stats(0)["ring_allocated"]
pinstage.configure(ring_bytes=1 << 16, device=0)  # retires the pinned slab, freed once its copy is done
second = pinstage.stage_to_device(list(range(500)), torch.int64)
pinstage.empty_cache(0)
torch.cuda.synchronize()
assert first.cpu().tolist() == list(range(1000)) and second.cpu().tolist() == list(range(500))
s = pinstage.stats(0)
assert s["ring_allocated"] and (1 << 16) <= s["ring_bytes"] < (1 << 17) and s["in_flight_bytes"] == 0, s
print("ok")
"""


@pytest.mark.cuda
def test_configure_before_the_first_staging_frees_nothing_and_after_it_frees_the_old_ring():
    """configure(ring_bytes=...) before a ring was ever pinned replaces it without waiting for the
    device; after a staging it retires the pinned ring, and copies from both rings keep their values
    (behaviour kept when the unpinned ring stopped being retired and then swept)."""
    assert "ok" in run_child(RESIZED_BEFORE_AND_AFTER_PINNING, timeout=120)
