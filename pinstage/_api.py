"""pinstage's public functions: the compiled staging functions as they are, and the fetch, stats and
configuration calls with their signatures, types and documentation in front of the compiled core."""

from typing import List, Optional, Sequence, TypedDict, Union

import torch

from . import _C

Device = Union[torch.device, str, int, None]
RingFullError = _C.RingFullError


# The staging calls are the compiled functions themselves: no Python frame on the hot path. Their
# documentation is in csrc/bindings/docs.h.
stage_to_device = _C.stage_to_device
stage_many = _C.stage_many
stage_into = _C.stage_into


class FetchHandle:
    """A device-to-host copy into pinned ring memory, returned at once by fetch_to_host/fetch_many.

    ready() says whether the copy has completed (never waits); wait() waits for this copy only;
    tensor()/tensors(), numpy() and tolist() give the values (waiting first if needed). The memory is
    reused only when the copy has completed and the handle has been released (release(), the end of
    a `with` block, or garbage collection) and no tensor or array from it is alive: a value read from
    a handle is never overwritten underneath the reader. Copy out (`.clone()`) what you keep long,
    so that the ring can reuse its memory. A handle may be shared by threads: release() while
    another thread waits lets that wait finish (or raise RuntimeError if it had not begun).
    """

    __slots__ = ("_handle", "_many")

    def __init__(self, handle, many):
        self._handle = handle
        self._many = many

    def ready(self) -> bool:
        return self._handle.ready()

    def wait(self) -> "FetchHandle":
        """Waits (GIL released) for this fetch's copy; raises inside pinstage.testing.no_sync()."""
        self._handle.wait()
        return self

    def tensors(self) -> List[torch.Tensor]:
        """CPU tensors over the fetched memory, one per fetched tensor."""
        return self._handle.tensors()

    def tensor(self) -> torch.Tensor:
        """The CPU tensor of a single fetch (fetch_to_host)."""
        if self._many:
            raise TypeError("pinstage.FetchHandle.tensor: this handle holds several tensors; use tensors()")
        return self._handle.tensors()[0]

    def numpy(self):
        """The fetched values as numpy arrays over the pinned memory (no copy), waiting for the copy
        first if it has not completed: one array for fetch_to_host, a list of them for fetch_many.
        The ring keeps the memory while an array is alive; `.copy()` what you keep long."""
        values = [t.numpy() for t in self._handle.tensors()]
        return values if self._many else values[0]

    def tolist(self):
        """The fetched values as (nested) Python lists, waiting for the copy first if it has not
        completed: one list for fetch_to_host, a list of them for fetch_many. The lists are copies:
        nothing holds the ring's memory afterwards."""
        values = [t.tolist() for t in self._handle.tensors()]
        return values if self._many else values[0]

    def release(self) -> None:
        """Lets the ring reuse the memory once the copy has completed (tensors from it keep it)."""
        self._handle.release()

    @property
    def released(self) -> bool:
        return self._handle.released

    def __enter__(self) -> "FetchHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self):
        state = "released" if self.released else ("ready" if self.ready() else "in flight")
        return "<pinstage.FetchHandle of %d tensor(s), %s>" % (len(self._handle), state)


def fetch_to_host(tensor: torch.Tensor, stream: Optional[torch.cuda.Stream] = None) -> FetchHandle:
    """Copies a device tensor into pinned ring memory on `stream` (default: its device's current
    stream) and returns at once with a FetchHandle. The copy waits for nothing but work already
    queued on that stream; the source tensor may be freed right after the call.
    A CPU tensor gives a handle over a copy of it, ready at once. Conjugate and negative views
    come back resolved; a quantized tensor, or one without memory of its own (a tensor subclass
    wrapping others, a fake or zero tensor, a nested tensor), raises TypeError."""
    return FetchHandle(_C.fetch([tensor], stream, False), many=False)


def fetch_many(tensors: Sequence[torch.Tensor], stream: Optional[torch.cuda.Stream] = None) -> FetchHandle:
    """fetch_to_host for several tensors of one device: one ring region, one fence, one copy per
    tensor; handle.tensors() gives them in order."""
    return FetchHandle(_C.fetch(tensors, stream, True), many=True)


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
