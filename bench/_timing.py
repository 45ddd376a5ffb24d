"""Host-side timing helpers shared by pinstage's benchmarks.

The quantity of interest is host time per call (what the CPU spends before it can go on preparing the
next step), so everything here is perf_counter_ns around a loop of calls, never CUDA events. A timed
sample is one loop of `n` calls; several samples are taken and the median reported, which is robust
to the odd scheduler hiccup or page fault that a mean would absorb.
"""

import gc
import os
import statistics
import time


def pin_to_one_core():
    """Keeps the calling thread (and the threads it starts later) on one core, the last it may use,
    and returns it; None where the OS has no affinity call or refuses it. Unpinned, the timed thread
    shares and changes cores with the driver's and the kernel's work on copy completions, which cost
    the call that touches more memory the most (docs/measuring.md). Not for race benchmarks: on one
    core vLLM's row writers raced no more (bench/results/h200/RESULTS.md)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = max(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {core})
    except OSError:  # a container may forbid it: time unpinned
        return None
    return core


def loop_ns(call, n):
    """Wall time in ns of `n` back-to-back calls of `call()`; results are dropped at once so that
    device allocations are recycled by the caching allocator instead of piling up."""
    start = time.perf_counter_ns()
    for _ in range(n):
        call()
    return time.perf_counter_ns() - start


def estimate_call_ns(call, min_total_ns=1_000_000, max_calls=1 << 20):
    """Rough per-call cost: double the loop length until one loop takes at least `min_total_ns`.
    Used only to size the timed loops and the GPU-busy kernel, not as a result."""
    call()  # first call may allocate, JIT or fault pages in
    n = 1
    while True:
        elapsed = loop_ns(call, n)
        if elapsed >= min_total_ns or n >= max_calls:
            return elapsed / n
        n *= 2


def calls_for_duration(per_call_ns, target_ns, min_calls=1, max_calls=None):
    """Number of calls that makes one timed loop last about `target_ns`, clamped to the bounds
    (max_calls wins over min_calls: it encodes hard limits such as the staging ring's size)."""
    n = max(min_calls, int(round(target_ns / max(per_call_ns, 1.0))))
    if max_calls is not None:
        n = min(n, max_calls)
    return max(1, n)


class GcPaused:
    """Context manager that keeps the cyclic collector off inside, so that a collection triggered by
    some unrelated allocation does not land inside one sample. (No gc.collect() up front: with torch
    imported a full collection takes ~0.1 s, which would dominate a --quick run.)"""

    def __enter__(self):
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self._was_enabled:
            gc.enable()
        return False


def summarize_ns(per_call_ns):
    """Median / min / max of per-call samples, in microseconds."""
    us = [v / 1000.0 for v in per_call_ns]
    return {
        "median_us": statistics.median(us),
        "min_us": min(us),
        "max_us": max(us),
        "samples_us": us,
    }


def rotated(names, round_index):
    """The methods' order in one round of samples: each round starts one further along, so that no
    method always runs first or right after the same neighbour."""
    shift = round_index % max(1, len(names))
    return names[shift:] + names[:shift]


def interleaved(calls, repeats, sample_ms):
    """name -> call: per-call samples of each (loops of about `sample_ms`), taken in turn, one of each
    per round with the order rotated every round and no device synchronisation in between; returns
    name -> summarize_ns."""
    loops = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        loops[name] = calls_for_duration(estimate_call_ns(call, 100_000), sample_ms * 1e6)
    samples = {name: [] for name in calls}
    with GcPaused():
        for round_index in range(repeats):
            for name in rotated(list(calls), round_index):
                samples[name].append(loop_ns(calls[name], loops[name]) / loops[name])
    return {name: summarize_ns(s) for name, s in samples.items()}


def add_sampling_args(parser, sizes, sample_ms=5.0):
    """The arguments every host-time benchmark takes: sizes to sweep, samples per cell, loop length."""
    parser.add_argument("--sizes", default=sizes)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=sample_ms)
