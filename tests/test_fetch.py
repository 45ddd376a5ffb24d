"""fetch_to_host / fetch_many: device tensors into pinned ring memory without waiting, read through a
handle; the memory is reused only once the copy is done and nothing reads it any more."""

import textwrap

import gpu_busy
import numpy as np
import pytest
import torch
from staging_reference import DTYPES, dtype_name
from support import DEVICES, run_child
from tensor_kinds import WrapperTensor

import pinstage

SMALL_RING = 4096
BUSY_MS = 50  # far longer than the host work behind it, on any GPU


def busy(stream=None):
    """A long kernel on `stream`; returns an event that completes after it."""
    return gpu_busy.busy(BUSY_MS, stream)


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


# ---------------------------------------------------------------------------------------------- CPU


def test_cpu_tensors_give_a_ready_copy():
    src = torch.arange(6).view(2, 3)
    with pinstage.fetch_to_host(src) as handle:
        assert handle.ready()
        src.fill_(0)  # the handle holds a copy
        assert handle.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert isinstance(handle.numpy(), np.ndarray)
        assert torch.equal(handle.wait().tensor(), torch.arange(6).view(2, 3))
    assert handle.released
    with pytest.raises(RuntimeError, match="released"):
        handle.tensor()


def test_many_form_and_its_errors():
    with pinstage.fetch_many([torch.arange(3), torch.ones(2, dtype=torch.bfloat16)]) as handle:
        a, b = handle.tensors()
        assert a.tolist() == [0, 1, 2] and b.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="several tensors"):
            handle.tensor()
        assert handle.tolist() == [[0, 1, 2], [1.0, 1.0]]
    with pytest.raises(ValueError, match=r"^pinstage.fetch_many: nothing to fetch$"):
        pinstage.fetch_many([])
    with pytest.raises(TypeError, match="^pinstage.fetch_many: item 1 must be a torch.Tensor, got list$"):
        pinstage.fetch_many([torch.ones(1), [1, 2]])
    with pytest.raises(TypeError, match="^pinstage.fetch_to_host: tensor must be a torch.Tensor, got int$"):
        pinstage.fetch_to_host(3)
    with pytest.raises(ValueError, match="no stream applies"):
        pinstage.fetch_to_host(torch.ones(1), torch.cuda.Stream() if torch.cuda.is_available() else object())


# --------------------------------------------------------------------------------------------- CUDA

cuda = pytest.mark.cuda


@pytest.fixture
def small_ring():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        before = pinstage.stats()["ring_bytes"]
        pinstage.configure(ring_bytes=SMALL_RING)
        yield
        torch.cuda.synchronize()
        pinstage.configure(ring_bytes=before, on_full="overflow")
    else:
        yield


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_values_equal_cpu_copies_under_a_busy_stream(dtype, small_ring):
    shapes = [(), (0,), (1,), (7,), (33, 3), (4, 5, 6)]
    sources = [sample(dtype, shape, i).cuda() for i, shape in enumerate(shapes)]
    sources.append(sources[-1].transpose(0, 2))  # non-contiguous: gathered on the stream first
    expected = [s.cpu() for s in sources]
    # A new overflow block is pinned memory allocated on demand, which may wait for the GPU: let the
    # pool grow to this test's size first (steady state reuses its blocks).
    warm = [pinstage.fetch_to_host(s) for s in sources] + [pinstage.fetch_many(sources)]
    torch.cuda.synchronize()
    for h in warm:
        h.release()
    done = busy()
    handles = [pinstage.fetch_to_host(s) for s in sources]
    many = pinstage.fetch_many(sources)
    assert not done.query(), "the fetches waited for the busy stream"
    assert not any(h.ready() for h in handles[1:]), "ready() before the copy could have run"
    for handle, want in zip(handles, expected):
        got = handle.tensor()  # waits
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    for got, want in zip(many.tensors(), expected):
        assert torch.equal(got, want)


@cuda
def test_fetch_never_synchronises_and_wait_does_inside_no_sync():
    src = torch.arange(1000, device="cuda")
    pinstage.fetch_to_host(src).wait()  # lazy set-up outside the guard
    done = busy()
    with pinstage.testing.no_sync():
        handle = pinstage.fetch_to_host(src)
        assert not handle.ready()
        with pytest.raises(RuntimeError, match="synchronisation"):
            handle.wait()
    assert not done.query()
    assert handle.tolist() == list(range(1000))


@cuda
def test_a_held_handle_keeps_its_values_while_later_fetches_wrap_around_it(small_ring):
    keep = pinstage.fetch_to_host(torch.full((64,), 7, dtype=torch.int64, device="cuda")).wait()
    held_view = keep.tensor()
    before = pinstage.stats()
    for i in range(200):  # 200 x 512 bytes through a 4 KiB ring
        h = pinstage.fetch_to_host(torch.full((64,), i, dtype=torch.int64, device="cuda"))
        assert h.tensor().tolist() == [i] * 64
        h.release()
    after = pinstage.stats()
    assert held_view.tolist() == [7] * 64, "a held region was reused"
    assert keep.tolist() == [7] * 64
    assert after["fetches"] - before["fetches"] == 200
    keep.release()
    # The view alone still holds the memory.
    for i in range(50):
        pinstage.fetch_to_host(torch.full((64,), -i, dtype=torch.int64, device="cuda")).release()
    assert held_view.tolist() == [7] * 64, "a region viewed by a live tensor was reused"


@cuda
def test_released_unready_handles_are_reused_only_after_their_copy(small_ring):
    """Handles released while their copies wait behind a busy kernel, then fetches on an idle stream
    that complete first: had the ring handed those the released regions, the delayed copies would
    land on top of their values once the kernel ends."""
    early = [torch.full((100,), i, dtype=torch.int32, device="cuda") for i in range(60)]
    late = [torch.full((100,), -i, dtype=torch.int32, device="cuda") for i in range(60)]
    idle = torch.cuda.Stream()
    idle.wait_stream(torch.cuda.current_stream())  # the sources exist before it reads them
    done = gpu_busy.busy(500)  # compute-sanitizer slows the host: 50 ms ended before 120 fetches did
    for s in early:
        pinstage.fetch_to_host(s).release()  # released long before its copy runs
    later = [pinstage.fetch_to_host(s, stream=idle) for s in late]
    assert [h.tolist() for h in later] == [[-i] * 100 for i in range(60)]
    gpu_busy.assert_still_busy(done, "the later fetches were read")
    torch.cuda.synchronize()  # the released fetches' copies have run now
    for i, h in enumerate(later):
        assert h.tolist() == [-i] * 100, "a region a released fetch had yet to write was handed out again"


@cuda
def test_handles_outlive_configure():
    handle = pinstage.fetch_to_host(torch.arange(300, device="cuda"))
    pinstage.configure(ring_bytes=SMALL_RING * 2)
    pinstage.configure(ring_bytes=SMALL_RING * 4)
    for i in range(20):
        pinstage.fetch_to_host(torch.full((100,), i, device="cuda")).release()
    assert handle.tolist() == list(range(300))
    handle.release()
    torch.cuda.synchronize()
    pinstage.empty_cache()
    pinstage.configure(ring_bytes=8 << 20)


@cuda
@pytest.mark.parametrize("on_full", ["overflow", "wait", "error"])
def test_full_fetch_ring_follows_on_full(on_full, small_ring):
    pinstage.configure(on_full=on_full)
    done = busy()
    before = pinstage.stats()
    handles, raised = [], None
    for i in range(40):  # 40 x 400 bytes held: more than the 4 KiB ring
        try:
            handles.append(pinstage.fetch_to_host(torch.full((100,), i, dtype=torch.int32, device="cuda")))
        except pinstage.RingFullError as exc:
            raised = exc
            break
    after = pinstage.stats()
    if on_full == "error":
        # Raised at the first fetch with no room, without waiting and without an overflow block.
        assert raised is not None and 0 < len(handles) < 40
        assert after["fetch_overflows"] == before["fetch_overflows"]
    else:
        # Held handles cannot be waited away: "wait" overflows rather than wait forever.
        assert raised is None and after["fetch_overflows"] > before["fetch_overflows"]
    assert not done.query(), "a full fetch ring waited for the busy stream"
    for i, h in enumerate(handles):
        assert h.tolist() == [i] * 100


@cuda
def test_capturing_stream_is_refused():
    stream = torch.cuda.Stream()
    src = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = src * 2
        with pytest.raises(RuntimeError, match="(?i)captur"):
            pinstage.fetch_to_host(y)
    graph.replay()
    assert pinstage.fetch_to_host(y).tolist() == [2.0] * 4


@cuda
def test_source_freed_right_after_the_fetch_on_another_stream():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    handles, expected = [], []
    busy(side)
    for i in range(50):
        src = torch.full((1000,), i, dtype=torch.int64, device="cuda")
        handles.append(pinstage.fetch_to_host(src, side))
        expected.append(i)
        del src  # the allocator may hand the memory out again on the current stream
        torch.full((1000,), -1, dtype=torch.int64, device="cuda")
    for h, i in zip(handles, expected):
        assert h.tolist() == [i] * 1000


@cuda
def test_exit_with_fetches_in_flight():
    script = textwrap.dedent(
        """
        import torch, pinstage
        src = torch.arange(6400, device="cuda")  # allocated first: a cudaMalloc may wait for the GPU
        pinstage.fetch_to_host(src[:1]).wait()  # the ring exists before the clock starts
        torch.cuda._sleep(200_000_000)
        done = torch.cuda.Event(); done.record()
        keep = [pinstage.fetch_to_host(src[64 * i: 64 * (i + 1)]) for i in range(100)]
        print("in flight", not done.query(), flush=True)
        """
    )
    assert "in flight True" in run_child(script, timeout=120)


# ------------------------------------------------------------------------- what a fetch may copy


@pytest.mark.parametrize("device", DEVICES)
def test_conjugate_and_negative_views_come_back_resolved(device):
    z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64, device=device)
    x = torch.tensor([1.5, -2.0, 3.0], device=device)
    assert pinstage.fetch_to_host(z.conj()).tolist() == [1 - 2j, -3 + 4j]
    assert pinstage.fetch_to_host(x._neg_view()).tolist() == [-1.5, 2.0, -3.0]
    strided = torch.stack([z, z + 1], 1).conj()[:, 0]  # a conjugate view that is not contiguous
    a, b = pinstage.fetch_many([z.conj().imag, strided]).tensors()
    assert a.tolist() == [-2.0, 4.0] and b.tolist() == [1 - 2j, -3 + 4j]


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_without_memory_of_their_own_are_refused(device):
    q = torch.quantize_per_tensor(torch.tensor([1.0, 2.0], device=device), 0.5, 0, torch.qint8)
    with pytest.raises(TypeError, match="^pinstage.fetch_to_host: tensor 0 is quantized"):
        pinstage.fetch_to_host(q)
    with pytest.raises(TypeError, match="^pinstage.fetch_many: tensor 0 is quantized"):
        pinstage.fetch_many([q])
    wrapper = WrapperTensor(torch.arange(4, device=device))
    with pytest.raises(TypeError, match="tensor 1 .*has no memory of its own"):
        pinstage.fetch_many([torch.arange(2, device=device), wrapper])
    with pytest.raises(TypeError, match="has no memory of its own"):
        pinstage.fetch_to_host(torch._efficientzerotensor(4, device=device))
    nested = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0)], device=device)
    with pytest.raises(TypeError, match="nested tensor"):
        pinstage.fetch_to_host(nested)
    assert pinstage.fetch_to_host(torch.arange(3, device=device)).tolist() == [0, 1, 2]  # still works


@cuda
def test_a_strided_source_freed_right_after_the_fetch_is_read_before_its_memory_is_reused():
    """A non-contiguous source is made contiguous by a kernel on the fetch stream: the SOURCE's memory
    must stay unused (recorded on that stream) until that kernel has read it, not only the copy's."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    busy(side)
    handles = []
    for i in range(20):
        src = torch.full((1000, 2), i, dtype=torch.int64, device="cuda")[:, 0]  # strided
        handles.append(pinstage.fetch_to_host(src, side))
        del src  # its block may be handed out again on the current stream, which is idle
        torch.full((2000,), -1, dtype=torch.int64, device="cuda")
    for i, h in enumerate(handles):
        assert h.tolist() == [i] * 1000


@cuda
def test_release_from_another_thread_while_waiting_is_safe():
    """wait()/tensors() run with the GIL released; release() from another thread meanwhile must
    neither crash nor hand the waiter a reset region (in a child: a regression may segfault)."""
    script = textwrap.dedent(
        """
        import threading, torch, pinstage
        src = torch.arange(1 << 16, device="cuda")
        outcomes = {"waited": 0, "released": 0}
        for i in range(300):
            torch.cuda._sleep(200_000)
            h = pinstage.fetch_to_host(src)
            def wait():
                try:
                    values = h.tensors()[0] if i % 2 else h.wait()
                    outcomes["waited"] += 1
                except RuntimeError as e:
                    assert "released" in str(e), e
                    outcomes["released"] += 1
            t = threading.Thread(target=wait)
            t.start()
            h.release()
            t.join()
        torch.cuda.synchronize()
        assert sum(outcomes.values()) == 300, outcomes
        assert pinstage.stats()["fetch_in_flight_bytes"] == 0
        print(outcomes)
        """
    )
    run_child(script, timeout=120)
