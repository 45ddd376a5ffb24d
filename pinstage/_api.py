"""pinstage's public functions: the compiled staging and fetch functions as they are, and the stats and
configuration calls with their signatures, types and documentation in front of the compiled core."""

from typing import Optional, TypedDict, Union

import torch

from . import _C

Device = Union[torch.device, str, int, None]
RingFullError = _C.RingFullError


# The staging and fetch calls and the fetch handle are the compiled ones themselves: no Python frame
# on the hot path. Their documentation is in csrc/bindings/docs.h.
stage_to_device = _C.stage_to_device
stage_many = _C.stage_many
stage_into = _C.stage_into
fetch_to_host = _C.fetch_to_host
fetch_many = _C.fetch_many
FetchHandle = _C.FetchHandle


class Stats(TypedDict):
    """One device's counters and ring occupancy (stats()); on the CPU the ring keys are 0."""

    device: str
    ring_allocated: bool
    on_full: str  # what a full ring does: "overflow", "wait" or "error"
    ring_bytes: int  # the staging ring's size
    calls: int  # staging calls
    bytes_staged: int  # bytes they moved
    copies: int  # host-to-device copies enqueued
    fallbacks: int  # items converted by torch.tensor, not pinstage's converters
    in_flight_bytes: int  # ring bytes still read by copies
    peak_in_flight_bytes: int
    pending_regions: int  # ring regions not yet released
    overflows: int  # requests served by overflow blocks
    waits: int  # waits under on_full="wait"
    wraps: int  # times the ring's allocation went back to its start
    events_created: int  # CUDA events made (none in steady state)
    event_records: int  # cudaEventRecord calls (one per 32 regions or fewer)
    event_queries: int  # cudaEventQuery calls, ready or not (about one per fence)
    overflow_reserved_bytes: int  # pinned overflow blocks kept now
    overflow_peak_reserved_bytes: int  # ... at most
    overflow_in_flight_bytes: int  # ... in use by copies
    fetches: int  # fetch_to_host calls
    fetch_bytes: int  # bytes they brought back
    fetch_in_flight_bytes: int  # fetch ring and overflow bytes not yet released
    fetch_overflows: int  # fetches served by overflow blocks


def stats(device: Device = None) -> Stats:
    """One device's rings: counters and occupancy (device None: the current CUDA device, or the CPU
    without CUDA). The keys are Stats'."""
    return _C.stats(device)


def configure(*, ring_bytes: Optional[int] = None, on_full: Optional[str] = None, device: Device = None) -> None:
    """Ring size and what to do when a ring is full, for one device or (device=None) every device
    and the rings made later.

    ring_bytes: an int, at least 4096 (one page; ValueError below it, TypeError for a str: the
    environment variable PINSTAGE_RING_BYTES takes "16M", configure takes 16 << 20); default 8 MiB.
    on_full: "overflow" (serve from a pinned overflow block, never wait: the default), "wait" (wait
    for the oldest copy; where the oldest region is still being written or read, which waiting
    could never end, an overflow block serves instead) or "error" (raise RingFullError). Resizing
    retires the old ring memory, freed once its copies have completed (at a later configure() or
    empty_cache()).
    """
    _C.configure(ring_bytes, on_full, device)


def empty_cache(device: Device = None) -> None:
    """Frees the pinned memory that pinstage keeps but no copy uses: overflow blocks left from a
    burst and ring memory retired by configure(). It waits for the device (cudaDeviceSynchronize,
    which holds up no other thread's staging) before freeing: call it off the hot path. device None:
    every device."""
    _C.empty_cache(device)
