#!/usr/bin/env python3
"""Stress: a million stagings from several threads on several busy streams through a ring of a few
KiB (so that it wraps and overflows all the time), every value checked on the device; then a million
steady-state calls on the default ring with the pinned memory, the events and the process's RSS
watched, and a burst whose overflow memory empty_cache() gives back.

    python bench/stress.py [--stagings 1000000] [--threads 4] [--json out.json]

Every staged tensor holds 64 int64 values base + arange(64), with a base unique to the staging, so
each chunk of results is checked on its stream against values made on the device (no copy back).
"""

import argparse
import os
import sys
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402

import pinstage  # noqa: E402
from pinstage.builders import BatchState, Request  # noqa: E402

N = 64  # values per staged tensor
CHUNK = 256  # stagings checked together
OPS = ("stage_to_device", "stage_list", "stage_many", "stage_into", "batch_state", "fetch")


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Worker:
    """One thread: stagings of distinct values on its streams, checked chunk by chunk on the device."""

    def __init__(self, index, streams, stagings, sleep_cycles):
        self.index, self.streams, self.stagings, self.sleep_cycles = index, streams, stagings, sleep_cycles
        self.bad = {s: torch.zeros((), dtype=torch.int64, device="cuda") for s in streams}
        self.outs = {s: torch.empty((CHUNK, N), dtype=torch.int64, device="cuda") for s in streams}
        self.count = 0
        self.bytes = 0
        self.fetched = 0
        self.fetch_bad = 0
        self.error = None
        self.state = BatchState()
        for row in range(8):
            self.state.add(Request([row + 1], req_pool_idx=row))

    def base(self, j):
        return (self.index << 40) + j * 1000

    def run(self):
        try:
            j = 0
            while j < self.stagings:
                stream = self.streams[(j // CHUNK) % len(self.streams)]
                j = self.chunk(stream, j)
        except Exception as exc:  # noqa: BLE001 - reported by main()
            self.error = exc

    def chunk(self, stream, j0):
        """CHUNK stagings onto `stream`, then their check, all queued on that stream."""
        results, bases = [], []
        out = self.outs[stream]
        fetches = []
        with torch.cuda.stream(stream):
            torch.cuda._sleep(self.sleep_cycles)  # the copies queue behind this: the ring fills and wraps
            k = 0
            while k < CHUNK:
                j = j0 + k
                base = self.base(j)
                values = np.arange(base, base + N, dtype=np.int64)
                op = OPS[j % len(OPS)]
                if op == "stage_to_device":
                    results.append(pinstage.stage_to_device(values, torch.int64, stream))
                elif op == "stage_list":
                    results.append(pinstage.stage_to_device(values.tolist(), torch.int64, stream))
                elif op == "stage_many":
                    parts = pinstage.stage_many([(values[:40], torch.int64), (values[40:], torch.int64)], stream)
                    results.append(torch.cat(parts))
                elif op == "stage_into":
                    pinstage.stage_into(values, out[k], stream)
                    results.append(out[k])
                elif op == "batch_state":
                    results.append(pinstage.stage_to_device(values, torch.int64, stream))
                    self.state.decode_inputs(stream=stream)  # a second staging call
                    self.count += 1
                    self.bytes += 3 * 8 * len(self.state)
                else:  # a fetch of a device tensor, checked on the host later
                    src = torch.arange(base, base + N, dtype=torch.int64, device="cuda")
                    fetches.append((pinstage.fetch_to_host(src, stream), base))
                    results.append(src)
                    self.count -= 1  # a fetch, not a staging
                bases.append(base)
                self.count += 1
                self.bytes += N * 8 if op != "fetch" else 0
                k += 1
            stacked = torch.stack(results)
            expected = torch.tensor(bases, dtype=torch.int64).pin_memory().to("cuda", non_blocking=True)
            expected = expected[:, None] + torch.arange(N, device="cuda")[None, :]
            self.bad[stream] += (stacked != expected).sum()
        for handle, base in fetches:
            values = handle.numpy()
            self.fetch_bad += int((values != np.arange(base, base + N)).sum())
            self.fetched += 1
            handle.release()
        return j0 + CHUNK


def race(stagings, threads, streams_per_thread, ring_bytes):
    pinstage.configure(ring_bytes=ring_bytes, on_full="overflow")
    torch.cuda.synchronize()
    before = pinstage.stats()
    per_thread = stagings // threads
    sleep_cycles = 2_000_000  # ~1 ms per chunk: the chunk's copies queue behind it, so the ring fills
    workers = [
        Worker(t, [torch.cuda.Stream() for _ in range(streams_per_thread)], per_thread, sleep_cycles)
        for t in range(threads)
    ]
    t0 = time.perf_counter()
    pool = [threading.Thread(target=w.run) for w in workers]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    errors = [repr(w.error) for w in workers if w.error is not None]
    after = pinstage.stats()
    corrupt = sum(int(b.item()) for w in workers for b in w.bad.values()) + sum(w.fetch_bad for w in workers)
    staged_bytes = sum(w.bytes for w in workers)
    result = {
        "stagings": sum(w.count for w in workers),
        "fetches": sum(w.fetched for w in workers),
        "threads": threads,
        "streams": threads * streams_per_thread,
        "ring_bytes": ring_bytes,
        "seconds": round(seconds, 1),
        "bytes_staged": after["bytes_staged"] - before["bytes_staged"],
        "bytes_expected": staged_bytes,
        "calls": after["calls"] - before["calls"],
        "wraps": after["wraps"] - before["wraps"],
        "overflows": after["overflows"] - before["overflows"],
        "fetch_overflows": after["fetch_overflows"] - before["fetch_overflows"],
        "in_flight_bytes_after_sync": after["in_flight_bytes"],
        "fetch_in_flight_bytes_after_sync": after["fetch_in_flight_bytes"],
        "overflow_peak_reserved_bytes": after["overflow_peak_reserved_bytes"],
        "corrupt_values": corrupt,
        "errors": errors,
    }
    pinstage.configure(ring_bytes=8 << 20)
    torch.cuda.synchronize()
    pinstage.empty_cache()
    return result


def steady_state(calls):
    """`calls` stagings of 16 values on the default ring, behind a GPU kept a little busy: pinned
    memory, events and RSS after a warm-up against after the run."""
    pinstage.configure(ring_bytes=8 << 20, on_full="overflow")
    values = list(range(16))
    warm = 20_000

    def run(n):
        for i in range(n):
            if i % 64 == 0:
                torch.cuda._sleep(20_000)
            pinstage.stage_to_device(values, torch.int64)
            if i % 256 == 0:
                pinstage.fetch_to_host(torch.ones(8, device="cuda")).release()

    run(warm)
    torch.cuda.synchronize()
    before, rss_before = pinstage.stats(), rss_bytes()
    t0 = time.perf_counter()
    run(calls)
    torch.cuda.synchronize()
    after, rss_after = pinstage.stats(), rss_bytes()
    pinned_before = before["ring_bytes"] + before["overflow_reserved_bytes"]
    pinned_after = after["ring_bytes"] + after["overflow_reserved_bytes"]
    return {
        "calls": calls,
        "seconds": round(time.perf_counter() - t0, 1),
        "pinned_bytes_before": pinned_before,
        "pinned_bytes_after": pinned_after,
        "events_created_before": before["events_created"],
        "events_created_after": after["events_created"],
        "rss_growth_bytes": rss_after - rss_before,
        "overflows": after["overflows"] - before["overflows"],
    }


def burst_and_trim():
    """A burst through a 16 KiB ring overflows; once its copies are done, empty_cache() gives the
    overflow blocks back."""
    pinstage.configure(ring_bytes=16 << 10)
    torch.cuda.synchronize()
    pinstage.empty_cache()
    torch.cuda._sleep(100_000_000)
    kept = [pinstage.stage_to_device(np.arange(i, i + 4096), torch.int64) for i in range(200)]
    burst = pinstage.stats()
    torch.cuda.synchronize()
    ok = all(torch.equal(t.cpu(), torch.arange(i, i + 4096)) for i, t in enumerate(kept))
    pinstage.empty_cache()
    after = pinstage.stats()
    pinstage.configure(ring_bytes=8 << 20)
    return {
        "overflow_reserved_bytes_after_burst": burst["overflow_reserved_bytes"],
        "overflow_peak_reserved_bytes": burst["overflow_peak_reserved_bytes"],
        "overflow_reserved_bytes_after_empty_cache": after["overflow_reserved_bytes"],
        "values_ok": ok,
    }


def checks(report, stagings):
    r, s, b = report["race"], report["steady"], report["burst"]
    return [
        _report.check("stagings in the race run", r["stagings"], ">= %d" % stagings, r["stagings"] >= stagings),
        _report.check(
            "corrupt values",
            r["corrupt_values"],
            "== 0",
            r["corrupt_values"] == 0 and not r["errors"],
            "; ".join(r["errors"]),
        ),
        _report.check(
            "bytes counted by stats() = bytes staged",
            r["bytes_staged"],
            "== %d" % r["bytes_expected"],
            r["bytes_staged"] == r["bytes_expected"],
        ),
        _report.check(
            "in-flight bytes after a synchronize",
            r["in_flight_bytes_after_sync"] + r["fetch_in_flight_bytes_after_sync"],
            "== 0",
            r["in_flight_bytes_after_sync"] + r["fetch_in_flight_bytes_after_sync"] == 0,
        ),
        _report.check(
            "the small ring wrapped and overflowed",
            r["wraps"],
            "> 0 (and overflows > 0)",
            r["wraps"] > 0 and r["overflows"] > 0,
            "overflows %d" % r["overflows"],
        ),
        _report.check(
            "steady state: pinned bytes growth",
            s["pinned_bytes_after"] - s["pinned_bytes_before"],
            "== 0",
            s["pinned_bytes_after"] == s["pinned_bytes_before"],
        ),
        _report.check(
            "steady state: events created",
            s["events_created_after"] - s["events_created_before"],
            "== 0",
            s["events_created_after"] == s["events_created_before"],
        ),
        _report.check(
            "steady state: RSS growth (bytes)", s["rss_growth_bytes"], "< 16 MiB", s["rss_growth_bytes"] < 16 << 20
        ),
        _report.check(
            "burst: overflow memory after empty_cache()",
            b["overflow_reserved_bytes_after_empty_cache"],
            "== 0",
            b["overflow_reserved_bytes_after_empty_cache"] == 0 and b["values_ok"],
        ),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stagings", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--streams-per-thread", type=int, default=2)
    p.add_argument("--ring-bytes", type=int, default=4096)
    p.add_argument("--steady-calls", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=os.path.join(HERE, "out", "stress.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("stress: no GPU is visible; nothing to do")
        return
    if args.quick:
        args.stagings, args.steady_calls = 50_000, 50_000
    report = {"meta": _report.machine_meta()}
    print(
        "race: %d stagings, %d threads x %d streams, %d-byte ring"
        % (args.stagings, args.threads, args.streams_per_thread, args.ring_bytes),
        flush=True,
    )
    report["race"] = race(args.stagings, args.threads, args.streams_per_thread, args.ring_bytes)
    print(report["race"], flush=True)
    report["steady"] = steady_state(args.steady_calls)
    print(report["steady"], flush=True)
    report["burst"] = burst_and_trim()
    print(report["burst"], flush=True)
    report["checks"] = checks(report, args.stagings)
    _report.print_checks(report["checks"])
    _report.write_json(args.json, report)
    if not all(c["ok"] for c in report["checks"]):
        sys.exit("stress: a check failed (see above)")


if __name__ == "__main__":
    main()
