"""Keeping the GPU busy in tests: a copy queued behind a sleeping kernel is still unread when the host
goes on, so a reused ring region shows up as a wrong value and a host wait as a finished sleep.

torch.cuda._sleep counts GPU cycles; sleeps are sized for a ~2 GHz clock. No test concludes anything
from how long a call took: "the host did not wait" is an event still pending after the call.
"""

import torch

CYCLES_PER_US = 2000


def busy(ms, stream=None):
    """Queue ms of GPU sleep on stream (default: current); returns an event that completes after it."""
    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * 1000 * CYCLES_PER_US))
        done = torch.cuda.Event()
        done.record(stream)
    return done


def assert_still_busy(done, what):
    # Not an assertion about pinstage: it guards the test's premise (work was issued while the GPU
    # was busy). If it fires, the sleep is too short for this machine; lengthen it.
    assert not done.query(), "the GPU finished its sleep before %s; the test proved nothing" % what


def captured(step, warmups=3):
    """(graph, outputs): `step` run a few times on a side stream (the allocator's warm-up, as torch's
    graph docs advise), then captured once; replaying the graph reruns it on the same tensors."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    torch.cuda.synchronize()
    return graph, outputs
