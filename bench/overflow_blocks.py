#!/usr/bin/env python3
"""Where a staging goes when the ring is full: pinstage's overflow blocks (OverflowPool) against
PyTorch's CachingHostAllocator, whose blocks are reused only after the events torch records behind
their copies, in the same process.

Each call moves one CPU tensor of `size` bytes to the GPU while the stream is busy (a sleeping kernel
queued ahead of the timed loop), so that no block of the loop can be reused within it:
  pinstage_overflow  pinstage.stage_to_device with a 4 KiB ring: every call takes an overflow block
  torch_pinned       torch.empty(pin_memory=True) (the CachingHostAllocator), copy_, .to(non_blocking)
Both copy the bytes into pinned memory once, on one thread (torch's copy_ would split a large copy
over its intra-op threads where pinstage's memcpy runs on the caller's: torch.set_num_threads(1)
keeps the comparison on the blocks), and enqueue one copy; between loops the stream drains
(outside the timing), so each loop starts from blocks cached by the loops before: the steady state
of a serving loop. Host microseconds per call, medians of rotated, interleaved rounds.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import _timing  # noqa: E402
import torch  # noqa: E402
from microbench import GpuBusy  # noqa: E402

import pinstage  # noqa: E402

SIZES = [64 << 10, 256 << 10, 1 << 20]
CALLS_PER_LOOP = 16


def methods(src, dev):
    def torch_pinned():
        pinned = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        pinned.copy_(src)
        return pinned.to(dev, non_blocking=True)

    return {
        "pinstage_overflow": lambda: pinstage.stage_to_device(src, src.dtype, device=dev),
        "torch_pinned": torch_pinned,
    }


# Far longer than a loop of CALLS_PER_LOOP calls: the timing never waits for it (the drain between
# loops does), and a first cudaHostAlloc of a cache that has no free block can take milliseconds.
BUSY_US = 50_000.0


def measure(calls, busy, repeats):
    """name -> summarize_ns of the per-call host time, and how many loops outlived the busy kernel."""
    samples = {name: [] for name in calls}
    outlived = 0
    for call in calls.values():  # warm-up: both caches hold blocks before the first sample
        for _ in range(2 * CALLS_PER_LOOP):
            call()
    torch.cuda.synchronize()
    with _timing.GcPaused():
        for round_index in range(repeats):
            for name in _timing.rotated(list(calls), round_index):
                done = busy.launch(BUSY_US)
                ns = _timing.loop_ns(calls[name], CALLS_PER_LOOP)
                outlived += bool(done.query())
                samples[name].append(ns / CALLS_PER_LOOP)
                torch.cuda.synchronize()
    return {name: _timing.summarize_ns(s) for name, s in samples.items()}, outlived


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default=os.path.join(HERE, "out", "overflow_blocks.json"))
    args = p.parse_args(argv)
    _timing.pin_to_one_core()
    if not torch.cuda.is_available():
        raise SystemExit("overflow_blocks.py needs a CUDA device (it compares pinned-memory allocators)")
    dev = torch.device("cuda")
    torch.set_num_threads(1)
    pinstage.configure(ring_bytes=4096)
    busy = GpuBusy()
    before = pinstage.stats(dev)["overflows"]
    cells, rows, outlived = [], [["bytes", "pinstage_overflow us", "torch_pinned us", "pinstage / torch"]], 0
    for size in SIZES:
        result, idle = measure(
            methods(torch.randint(0, 1 << 30, (size // 8,), dtype=torch.int64), dev), busy, args.repeats
        )
        outlived += idle
        ours, theirs = result["pinstage_overflow"]["median_us"], result["torch_pinned"]["median_us"]
        cells.append({"bytes": size, "methods": result, "ratio": ours / theirs})
        rows.append([str(size), "%.1f" % ours, "%.1f" % theirs, "%.2f" % (ours / theirs)])
    overflows = pinstage.stats(dev)["overflows"] - before
    _report.print_table(rows)
    checks = [
        _report.check(
            "every pinstage call took an overflow block",
            overflows,
            ">= the calls made",
            overflows >= len(SIZES) * CALLS_PER_LOOP * args.repeats,
        ),
        _report.check(
            "timed loops that outlived the busy kernel (blocks could be reused)", outlived, "== 0", outlived == 0
        ),
    ]
    _report.print_checks(checks)
    _report.write_json(
        args.json,
        {
            "meta": _report.machine_meta(),
            "calls_per_loop": CALLS_PER_LOOP,
            "busy_us": BUSY_US,
            "cells": cells,
            "overflows": overflows,
            "checks": checks,
        },
    )


if __name__ == "__main__":
    main()
