#!/usr/bin/env python3
"""pinstage microbenchmark: host time per call of getting host data onto the GPU, against the
patterns engines use today, all in the same process.

With a GPU every method is timed twice per sample: with the GPU idle, and with the GPU busy (a long
torch.cuda._sleep kernel queued ahead of the timed loop, so that a hidden wait for the device shows
up as host time). Sections:
  lists       a Python list -> device tensor (int64, float32; 1 to 65536 values)
  many lists  10 lists of 256 in one stage_many, against 10 calls of each peer
  numpy       a numpy array -> device tensor (int64, int32, float32; 1, 256, 8192 values)
  many numpy  7 slices of 256 in one stage_many, against 7 copies of each peer
  fetch       a device tensor -> host (int64, float32; 1, 256, 8192 values), enqueue only
Without a GPU only the conversion runs (device="cpu"): lists and numpy arrays against torch.

A sample is perf_counter_ns around a loop of calls sized to a few ms, after a warm-up; the methods
of one cell take their samples in turn, in an order rotated every round; the median of the samples
is reported in microseconds per call with the min-max spread. Ratios within one run are what to
compare across machines.
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import _timing  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _baselines import CpuGpuBuffer  # noqa: E402

import pinstage  # noqa: E402

LIST_SIZES = [1, 16, 64, 256, 1024, 8192, 65536]
LIST_DTYPES = {"int64": torch.int64, "float32": torch.float32}
NUMPY_SIZES = [1, 256, 8192]
NUMPY_DTYPES = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32}
NUMPY_OF = {
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.float32: np.float32,
    torch.bool: np.bool_,
    torch.uint64: np.uint64,
}
# One scheduler step's sampling/decode inputs: token ids, top-k, temperatures/top-p/min-p, seeds, a
# flag per request, prefix data pointers.
MANY_DTYPES = [
    torch.int64,
    torch.int64,
    torch.int32,
    torch.float32,
    torch.float32,
    torch.float32,
    torch.int64,
    torch.bool,
    torch.uint64,
    torch.int64,
]
MANY_LENGTH = 256
MANY_NUMPY_DTYPES = [torch.int64, torch.int64, torch.int64, torch.float32, torch.float32, torch.int32, torch.float32]
TOKEN_VOCAB = 152064  # a Qwen2-sized vocabulary: token ids are realistic 5-6 digit ints

METHOD_NOTES = {
    "blocking": "torch.tensor(values, device=dev): a blocking copy",
    "pinned": "torch.tensor(values, pin_memory=True).to(dev, non_blocking=True)",
    "reused_buffer": "one persistent pinned buffer filled through numpy, then .to(dev, non_blocking=True); "
    "unsafe (it rewrites memory an earlier copy may still read), timing only",
    "floor": "copy_ of an already-filled pinned tensor into a device tensor: no conversion, the lower bound",
    "floor_alloc": "pinned.to(dev, non_blocking=True) of the same pre-filled pinned tensor: the floor plus the "
    "result's allocation, which stage_to_device makes too and copy_ does not",
    "pinstage": "pinstage.stage_to_device(values, dtype)",
    "stage_into": "pinstage.stage_into(values, out): no device allocation",
    "stage_many": "pinstage.stage_many: every item in one ring region and one copy",
    "vllm_buffer": "vLLM's pattern: numpy slice assignment into a persistent pinned tensor's .numpy() view, "
    "then gpu[:n].copy_(cpu[:n], non_blocking=True); unsafe on reuse, timing only",
    "pin_memory": "torch.from_numpy(x).pin_memory().to(dev, non_blocking=True)",
    "to_cpu": "tensor.cpu(): a blocking copy",
    "tolist": "tensor.tolist(): a blocking copy into Python ints",
    "non_blocking": "tensor.to('cpu', non_blocking=True) + event.record(); the reader synchronises the event later",
    "fetch_to_host": "pinstage.fetch_to_host(tensor) (+ release of the handle)",
    "torch_tensor": "torch.tensor(values, dtype=dtype) on the CPU",
    "numpy_array": "np.array(values, dtype) -> torch.from_numpy",
    "from_numpy_clone": "torch.from_numpy(x).to(dtype, copy=True)",
}

# A busy loop keeps every pinstage region in flight until it ends: keep one loop's staged bytes well
# under the default 8 MiB ring, so that the ring never has to overflow.
RING_BUDGET_BYTES = 4 << 20
RING_GRANULE_BYTES = 512
# A stream takes about a thousand pending operations; past that every launch blocks until the GPU
# drains, a wait that would be the benchmark's doing, not the method's.
MAX_QUEUED_COPIES = 512
MAX_SLEEP_MS = 200.0
SLEEP_SAFETY = 3.0
DEFAULT_CYCLES_PER_US = 1980

# Checks: ratios within one run.
PINNED_OVER_PINSTAGE = {16: 3.0, 8192: 10.0}
PINNED_X10_OVER_STAGE_MANY = 10.0
BUSY_OVER_IDLE = 1.3
# pinstage / floor host time for int64 lists, GPU idle and busy: conversion included.
PINSTAGE_OVER_FLOOR = {1: 1.15, 16: 1.15, 64: 1.15, 256: 1.15, 1024: 1.3}
DRIVER_CALL_SIZES = (16, 256, 1024)
NUMPY_PINSTAGE_OVER_VLLM = 0.9
NUMPY_MANY_OVER_VLLM_X7 = 1 / 3
FETCH_OVER_NON_BLOCKING_AT_256 = 0.5
CPU_TORCH_OVER_PINSTAGE_8192 = 5.0


def make_values(dtype, n, rng):
    """Python-list input shaped like what an engine stages for that dtype."""
    if dtype == torch.bool:
        return [rng.random() < 0.5 for _ in range(n)]
    if dtype.is_floating_point:
        return [rng.random() for _ in range(n)]
    if dtype == torch.uint64:
        return [0x7F00_0000_0000 + 4096 * rng.randrange(1 << 24) for _ in range(n)]  # data pointers
    if dtype == torch.int32:
        return [rng.randrange(1, 1024) for _ in range(n)]  # top-k like
    return [rng.randrange(TOKEN_VOCAB) for _ in range(n)]  # token ids


def ring_footprint(nbytes):
    return max(RING_GRANULE_BYTES, -(-nbytes // RING_GRANULE_BYTES) * RING_GRANULE_BYTES)


class Settings:
    def __init__(self, args):
        self.repeats = args.repeats or (3 if args.quick else 7)
        self.loop_ns = int((args.loop_ms or (1.0 if args.quick else 5.0)) * 1e6)
        self.estimate_ns = int(0.2e6 if args.quick else 1e6)
        self.min_calls = 2 if args.quick else 4


class GpuBusy:
    """Keeps the current stream busy with torch.cuda._sleep ahead of a timed loop."""

    def __init__(self):
        # _sleep counts SM cycles: measure the rate rather than trust a constant.
        cycles = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rate = None
        for _ in range(2):  # the first round warms up the kernel and the clocks
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            rate = cycles / (start.elapsed_time(end) * 1000.0)
        self.cycles_per_us = rate if rate and 200.0 <= rate <= 10_000.0 else float(DEFAULT_CYCLES_PER_US)

    def sleep_us_for(self, loop_estimate_us):
        return min(MAX_SLEEP_MS * 1000.0, SLEEP_SAFETY * loop_estimate_us + 1000.0)

    def launch(self, sleep_us):
        """The busy kernel and an event behind it: event.query() still False after the timed loop
        proves the GPU stayed busy for the whole loop."""
        torch.cuda._sleep(int(sleep_us * self.cycles_per_us))
        done = torch.cuda.Event()
        done.record()
        return done


class Timed:
    """One method's timed loop: its length (the same with the GPU idle and busy), the busy kernel's
    length, and its samples."""

    def __init__(self, call, settings, busy=None, max_calls=None, copies_per_call=1):
        self.call, self.busy = call, busy
        per_call_ns = _timing.estimate_call_ns(call, settings.estimate_ns)
        if busy is not None:
            torch.cuda.synchronize()
            cap = max(1, MAX_QUEUED_COPIES // copies_per_call)
            max_calls = cap if max_calls is None else min(max_calls, cap)
        self.n = _timing.calls_for_duration(per_call_ns, settings.loop_ns, settings.min_calls, max_calls)
        self.sleep_us = busy.sleep_us_for(self.n * per_call_ns / 1000.0) if busy is not None else None
        self.idle, self.busy_samples, self.covered = [], [], []
        _timing.loop_ns(call, self.n)
        if busy is not None:  # the busy warm-up grows host-side pools to a busy loop's depth
            torch.cuda.synchronize()
            busy.launch(self.sleep_us)
            _timing.loop_ns(call, self.n)
            torch.cuda.synchronize()

    def sample(self):
        """One idle sample, and one busy sample behind the busy kernel when there is a GPU."""
        self.idle.append(_timing.loop_ns(self.call, self.n) / self.n)
        if self.busy is None:
            return
        torch.cuda.synchronize()
        done = self.busy.launch(self.sleep_us)
        elapsed = _timing.loop_ns(self.call, self.n)
        self.covered.append(not done.query())
        torch.cuda.synchronize()
        self.busy_samples.append(elapsed / self.n)

    def result(self):
        out = {"calls_per_loop": self.n, "idle": _timing.summarize_ns(self.idle)}
        if self.busy is not None:
            out["busy"] = dict(
                _timing.summarize_ns(self.busy_samples),
                sleep_ms=self.sleep_us / 1000.0,
                loops_covered=sum(self.covered),
                loops=len(self.covered),
            )
        return out


def measure_methods(methods, settings, busy=None, max_calls=None, copies=None):
    """name -> result of each (name, call): the methods take their samples in turn, one each per
    round, in an order rotated every round, so that a drift of the machine reaches all alike."""
    out, timed = {}, {}
    with _timing.GcPaused():
        for name, call in methods:
            try:
                timed[name] = Timed(call, settings, busy, max_calls, (copies or {}).get(name, 1))
            except Exception as exc:  # noqa: BLE001 - one failing peer must not cost the rest of a round
                _failed(out, name, exc, busy)
        for round_index in range(settings.repeats):
            for name in _timing.rotated(list(timed), round_index):
                try:
                    timed[name].sample()
                except Exception as exc:  # noqa: BLE001
                    _failed(out, name, exc, busy)
                    del timed[name]
    out.update({name: t.result() for name, t in timed.items()})
    return {name: out[name] for name, _ in methods}


def _failed(out, name, exc, busy):
    if busy is not None:
        torch.cuda.synchronize()
    print("  ! %s failed: %s: %s" % (name, type(exc).__name__, exc), file=sys.stderr)
    out[name] = {"error": "%s: %s" % (type(exc).__name__, exc)}


def median(result, mode="idle"):
    if not result or mode not in result:
        return None
    return result[mode]["median_us"]


def ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def cell_text(result):
    """idle median [min-max] / busy median (a '*' marks busy samples where the kernel ended first,
    i.e. the loop waited for the GPU)."""
    if not result or "error" in result:
        return "error"
    idle = result["idle"]
    text = _report.fmt_us(idle["median_us"], (idle["min_us"], idle["max_us"]))
    if "busy" in result:
        busy = result["busy"]
        text += " / " + _report.fmt_us(busy["median_us"]) + ("*" if busy["loops_covered"] < busy["loops"] else "")
    return text


def fallbacks(device):
    return pinstage.stats(device=device)["fallbacks"]


# ----------------------------------------------------------------------------------------- GPU part


def list_methods(values, dtype, dev, reused):
    n = len(values)
    buf, buf_np = reused[dtype]
    prefilled = torch.tensor(values, dtype=dtype).pin_memory()
    floor_dst = torch.empty(n, dtype=dtype, device=dev)
    into_dst = torch.empty(n, dtype=dtype, device=dev)

    def reused_buffer():
        buf_np[:n] = values
        buf[:n].to(dev, non_blocking=True)

    return [
        ("blocking", lambda: torch.tensor(values, dtype=dtype, device=dev)),
        ("pinned", lambda: torch.tensor(values, dtype=dtype, pin_memory=True).to(dev, non_blocking=True)),
        ("reused_buffer", reused_buffer),
        ("floor", lambda: floor_dst.copy_(prefilled, non_blocking=True)),
        ("floor_alloc", lambda: prefilled.to(dev, non_blocking=True)),
        ("pinstage", lambda: pinstage.stage_to_device(values, dtype)),
        ("stage_into", lambda: pinstage.stage_into(values, into_dst)),
    ]


def many_list_methods(items, dev):
    buffers = []
    for values, dt in items:
        buf = torch.empty(len(values), dtype=dt, pin_memory=True)
        buffers.append((buf, buf.numpy(), values))

    def reused_x10():
        for buf, buf_np, values in buffers:
            buf_np[:] = values
            buf.to(dev, non_blocking=True)

    return [
        ("stage_many", lambda: pinstage.stage_many(items)),
        ("pinstage", lambda: [pinstage.stage_to_device(v, dt) for v, dt in items]),
        ("pinned", lambda: [torch.tensor(v, dtype=dt, pin_memory=True).to(dev, non_blocking=True) for v, dt in items]),
        ("reused_buffer", reused_x10),
        ("blocking", lambda: [torch.tensor(v, dtype=dt, device=dev) for v, dt in items]),
    ]


def numpy_methods(x, dtype, dev):
    vllm = CpuGpuBuffer.empty(len(x), dtype, dev)
    return [
        ("vllm_buffer", lambda: vllm.write(x)),
        ("pin_memory", lambda: torch.from_numpy(x).pin_memory().to(dev, non_blocking=True)),
        ("pinstage", lambda: pinstage.stage_to_device(x, dtype)),
    ]


def many_numpy_methods(arrays, dev):
    vllm = [CpuGpuBuffer.empty(len(x), dt, dev) for x, dt in arrays]

    def vllm_x7():
        for buffer, (x, _) in zip(vllm, arrays):
            buffer.write(x)

    return [
        ("stage_many", lambda: pinstage.stage_many(arrays)),
        ("vllm_buffer", vllm_x7),
        ("pin_memory", lambda: [torch.from_numpy(x).pin_memory().to(dev, non_blocking=True) for x, _ in arrays]),
    ]


def fetch_methods(t):
    event = torch.cuda.Event()

    def non_blocking():
        t.to("cpu", non_blocking=True)
        event.record()

    return [
        ("to_cpu", lambda: t.cpu()),
        ("tolist", lambda: t.tolist()),
        ("non_blocking", non_blocking),
        ("fetch_to_host", lambda: pinstage.fetch_to_host(t).release()),
    ]


def warm_up(dev, reused, seconds):
    """Every list method in turn for about `seconds`, untimed: the first sizes measured were up to
    1.6x slower for every method alike while the host and GPU left an idle state."""
    start = time.perf_counter()
    methods = [
        call for _, call in list_methods(make_values(torch.int64, 16, random.Random(0)), torch.int64, dev, reused)
    ]
    while time.perf_counter() - start < seconds:
        for call in methods:
            for _ in range(200):
                call()
        torch.cuda.synchronize()


def driver_calls(dev, busy, calls=512):
    """cudaEventQuery and cudaEventRecord calls per staging of an int64 list (pinstage.stats()),
    with the GPU idle (every fence done when the ring reclaims) and busy (none done): what a staging
    costs in driver calls beside its one cudaMemcpyAsync."""
    out = []
    for size in DRIVER_CALL_SIZES:
        values = make_values(torch.int64, size, random.Random(size))
        row = {"size": size}
        for mode in ("idle", "busy"):
            torch.cuda.synchronize()
            done = busy.launch(busy.sleep_us_for(calls * 20.0)) if mode == "busy" else None
            before = pinstage.stats(device=dev)
            for _ in range(calls):
                pinstage.stage_to_device(values, torch.int64)
            after = pinstage.stats(device=dev)
            row[mode] = {
                key: (after[key] - before[key]) / calls for key in ("event_queries", "event_records", "copies")
            }
            row[mode]["covered"] = done is None or not done.query()
            torch.cuda.synchronize()
        out.append(row)
    return out


def run_gpu(settings, report, quick):
    dev = torch.device("cuda", torch.cuda.current_device())
    busy = GpuBusy()
    report["meta"]["sleep_cycles_per_us"] = busy.cycles_per_us
    sizes = LIST_SIZES[:5] if quick else LIST_SIZES
    reused = {}
    for dtype in LIST_DTYPES.values():
        buf = torch.empty(max(sizes), dtype=dtype, pin_memory=True)
        reused[dtype] = (buf, buf.numpy())
    warm_up(dev, reused, 0.3 if quick else 2.0)
    sections = report["sections"]

    sections["lists"] = []
    for name, dtype in LIST_DTYPES.items():
        for size in sizes:
            values = make_values(dtype, size, random.Random(size))
            nbytes = size * torch.empty(0, dtype=dtype).element_size()
            max_calls = max(settings.min_calls, RING_BUDGET_BYTES // ring_footprint(nbytes))
            methods = measure_methods(list_methods(values, dtype, dev, reused), settings, busy, max_calls)
            sections["lists"].append({"dtype": name, "size": size, "methods": methods})
            print("  lists %-7s %6d: pinstage %s" % (name, size, cell_text(methods["pinstage"])), file=sys.stderr)

    items = [(make_values(dt, MANY_LENGTH, random.Random(i)), dt) for i, dt in enumerate(MANY_DTYPES)]
    nbytes = sum(ring_footprint(len(v) * torch.empty(0, dtype=dt).element_size()) for v, dt in items)
    max_calls = max(settings.min_calls, RING_BUDGET_BYTES // nbytes)
    copies = {m: len(items) for m in ("pinstage", "pinned", "reused_buffer", "blocking")}
    sections["many_lists"] = {
        "items": [[str(dt), len(v)] for v, dt in items],
        "methods": measure_methods(many_list_methods(items, dev), settings, busy, max_calls, copies),
    }

    sections["numpy"] = []
    before = fallbacks(dev)
    for name, dtype in NUMPY_DTYPES.items():
        for size in NUMPY_SIZES:
            x = np.array(make_values(dtype, size, random.Random(size)), dtype=NUMPY_OF[dtype])
            max_calls = max(settings.min_calls, RING_BUDGET_BYTES // ring_footprint(x.nbytes))
            methods = measure_methods(numpy_methods(x, dtype, dev), settings, busy, max_calls)
            sections["numpy"].append({"dtype": name, "size": size, "methods": methods})
            print("  numpy %-7s %6d: pinstage %s" % (name, size, cell_text(methods["pinstage"])), file=sys.stderr)
    rng = random.Random(7)
    arrays = [(np.array(make_values(dt, MANY_LENGTH, rng), dtype=NUMPY_OF[dt]), dt) for dt in MANY_NUMPY_DTYPES]
    copies = {m: len(arrays) for m in ("vllm_buffer", "pin_memory")}
    sections["many_numpy"] = {
        "items": [[str(dt), len(x)] for x, dt in arrays],
        "methods": measure_methods(many_numpy_methods(arrays, dev), settings, busy, None, copies),
    }
    report["numpy_fallbacks"] = fallbacks(dev) - before

    sections["fetch"] = []
    for name, dtype in LIST_DTYPES.items():
        for size in NUMPY_SIZES:
            t = torch.tensor(make_values(dtype, size, random.Random(size)), dtype=dtype, device=dev)
            max_calls = max(settings.min_calls, RING_BUDGET_BYTES // ring_footprint(t.nbytes))
            methods = measure_methods(fetch_methods(t), settings, busy, max_calls)
            sections["fetch"].append({"dtype": name, "size": size, "methods": methods})
            print("  fetch %-7s %6d: pinstage %s" % (name, size, cell_text(methods["fetch_to_host"])), file=sys.stderr)
    report["driver_calls"] = driver_calls(dev, busy)
    report["pinstage_stats"] = pinstage.stats(device=dev)


LIST_METHODS = ("blocking", "pinned", "reused_buffer", "floor", "floor_alloc", "pinstage", "stage_into")


def idle_busy_ratio(methods, a, b):
    return "%s, %s" % tuple(
        _report.fmt_ratio(ratio(median(methods[a], mode), median(methods[b], mode))) for mode in ("idle", "busy")
    )


def print_gpu(report):
    sections = report["sections"]
    lists_header = [
        "size",
        "blocking",
        "pinned",
        "reused buffer",
        "floor",
        "floor + alloc",
        "pinstage",
        "stage_into",
        "pinned / pinstage",
        "pinstage / floor idle, busy",
        "pinstage / floor + alloc",
        "stage_into / floor",
        "pinstage busy / idle",
    ]
    for dtype in LIST_DTYPES:
        print()
        print("Python list of %s -> device tensor: host us per call, GPU idle [min-max] / GPU busy" % dtype)
        rows = [lists_header]
        for cell in (c for c in sections["lists"] if c["dtype"] == dtype):
            m = cell["methods"]
            rows.append(
                [cell["size"]]
                + [cell_text(m[k]) for k in LIST_METHODS]
                + [
                    _report.fmt_ratio(ratio(median(m["pinned"]), median(m["pinstage"]))),
                    idle_busy_ratio(m, "pinstage", "floor"),
                    idle_busy_ratio(m, "pinstage", "floor_alloc"),
                    idle_busy_ratio(m, "stage_into", "floor"),
                    _report.fmt_ratio(ratio(median(m["pinstage"], "busy"), median(m["pinstage"]))),
                ]
            )
        _report.print_table(rows)
    print_legend(LIST_METHODS)
    print()
    print("Driver calls per staging of an int64 list besides its cudaMemcpyAsync (pinstage.stats()), GPU idle / busy")
    rows = [["size", "cudaEventQuery", "cudaEventRecord"]]
    for row in report.get("driver_calls", []):
        rows.append(
            [row["size"]]
            + ["%.3f / %.3f" % (row["idle"][key], row["busy"][key]) for key in ("event_queries", "event_records")]
        )
    _report.print_table(rows)

    many = sections["many_lists"]["methods"]
    print()
    print("10 lists of %d (mixed dtypes) -> 10 device tensors: host us per call, GPU idle / busy" % MANY_LENGTH)
    rows = [["method", "idle [min-max] / busy", "x stage_many"]]
    for name in ("stage_many", "pinstage", "pinned", "reused_buffer", "blocking"):
        label = name if name == "stage_many" else "10 x " + name
        rows.append(
            [label, cell_text(many[name]), _report.fmt_ratio(ratio(median(many[name]), median(many["stage_many"])))]
        )
    _report.print_table(rows)

    print()
    print("numpy array -> device tensor: host us per call, GPU idle [min-max] / GPU busy")
    rows = [["dtype", "size", "vLLM buffer", "pin_memory", "pinstage", "pinstage / vLLM buffer"]]
    for cell in sections["numpy"]:
        m = cell["methods"]
        rows.append(
            [cell["dtype"], cell["size"]]
            + [cell_text(m[k]) for k in ("vllm_buffer", "pin_memory", "pinstage")]
            + [_report.fmt_ratio(ratio(median(m["pinstage"]), median(m["vllm_buffer"])))]
        )
    _report.print_table(rows)
    many = sections["many_numpy"]["methods"]
    print()
    print("7 numpy slices of %d -> 7 device tensors" % MANY_LENGTH)
    rows = [["method", "idle [min-max] / busy", "x stage_many"]]
    for name in ("stage_many", "vllm_buffer", "pin_memory"):
        label = name if name == "stage_many" else "7 x " + name
        rows.append(
            [label, cell_text(many[name]), _report.fmt_ratio(ratio(median(many[name]), median(many["stage_many"])))]
        )
    _report.print_table(rows)
    print_legend(["vllm_buffer", "pin_memory", "stage_many"])

    print()
    print("device tensor -> host: host us per call to enqueue, GPU idle [min-max] / GPU busy")
    rows = [
        [
            "dtype",
            "size",
            "tensor.cpu()",
            "tensor.tolist()",
            "to(non_blocking) + event",
            "fetch_to_host",
            "fetch / non_blocking",
        ]
    ]
    for cell in sections["fetch"]:
        m = cell["methods"]
        rows.append(
            [cell["dtype"], cell["size"]]
            + [cell_text(m[k]) for k in ("to_cpu", "tolist", "non_blocking", "fetch_to_host")]
            + [_report.fmt_ratio(ratio(median(m["fetch_to_host"]), median(m["non_blocking"])))]
        )
    _report.print_table(rows)
    print_legend(["to_cpu", "tolist", "non_blocking", "fetch_to_host"])
    print(
        "(* after a busy figure: the busy kernel ended before the timed loop did in some samples, i.e. the loop "
        "waited for the GPU)"
    )


def print_legend(methods):
    for m in methods:
        print("  %s: %s" % (m, METHOD_NOTES[m]))


def gpu_checks(report):
    sections = report["sections"]
    out = []
    for size, need in PINNED_OVER_PINSTAGE.items():
        cell = next((c for c in sections["lists"] if c["dtype"] == "int64" and c["size"] == size), None)
        r = None if cell is None else ratio(median(cell["methods"]["pinned"]), median(cell["methods"]["pinstage"]))
        out.append(
            _report.check(
                "list of %d int64: pinned / pinstage host time" % size,
                r,
                ">= %g" % need,
                None if r is None else r >= need,
            )
        )
    for size, need in PINSTAGE_OVER_FLOOR.items():
        cell = next((c for c in sections["lists"] if c["dtype"] == "int64" and c["size"] == size), None)
        for mode in ("idle", "busy"):
            m = None if cell is None else cell["methods"]
            r = None if m is None else ratio(median(m["pinstage"], mode), median(m["floor"], mode))
            out.append(
                _report.check(
                    "list of %d int64: pinstage / floor host time, GPU %s" % (size, mode),
                    r,
                    "<= %g" % need,
                    None if r is None else r <= need,
                )
            )
    many = sections["many_lists"]["methods"]
    r = ratio(median(many["pinned"]), median(many["stage_many"]))
    out.append(
        _report.check(
            "10 lists of 256: 10 pinned calls / one stage_many",
            r,
            ">= %g" % PINNED_X10_OVER_STAGE_MANY,
            None if r is None else r >= PINNED_X10_OVER_STAGE_MANY,
        )
    )
    worst, where = None, ""
    timed = [("list %s x%d" % (c["dtype"], c["size"]), c["methods"]["pinstage"]) for c in sections["lists"]]
    timed += [("numpy %s x%d" % (c["dtype"], c["size"]), c["methods"]["pinstage"]) for c in sections["numpy"]]
    timed += [
        ("stage_many (lists)", many["stage_many"]),
        ("stage_many (numpy)", sections["many_numpy"]["methods"]["stage_many"]),
    ]
    timed += [("fetch %s x%d" % (c["dtype"], c["size"]), c["methods"]["fetch_to_host"]) for c in sections["fetch"]]
    for name, res in timed:
        r = ratio(median(res, "busy"), median(res))
        if r is not None and (worst is None or r > worst):
            worst, where = r, name
    out.append(
        _report.check(
            "pinstage busy / idle host time, worst case",
            worst,
            "<= %g" % BUSY_OVER_IDLE,
            None if worst is None else worst <= BUSY_OVER_IDLE,
            "at " + where,
        )
    )
    worst, where = None, ""
    for cell in sections["numpy"]:
        r = ratio(median(cell["methods"]["pinstage"]), median(cell["methods"]["vllm_buffer"]))
        if r is not None and (worst is None or r > worst):
            worst, where = r, "%s x%d" % (cell["dtype"], cell["size"])
    out.append(
        _report.check(
            "numpy arrays: pinstage / vLLM buffer host time, worst size",
            worst,
            "<= %g" % NUMPY_PINSTAGE_OVER_VLLM,
            None if worst is None else worst <= NUMPY_PINSTAGE_OVER_VLLM,
            "at " + where,
        )
    )
    many = sections["many_numpy"]["methods"]
    r = ratio(median(many["stage_many"]), median(many["vllm_buffer"]))
    out.append(
        _report.check(
            "7 numpy slices: stage_many / 7 vLLM buffer copies",
            r,
            "<= %.2f" % NUMPY_MANY_OVER_VLLM_X7,
            None if r is None else r <= NUMPY_MANY_OVER_VLLM_X7,
        )
    )
    out.append(
        _report.check(
            "torch.tensor fallbacks for numpy inputs", report["numpy_fallbacks"], "== 0", report["numpy_fallbacks"] == 0
        )
    )
    cell = next((c for c in sections["fetch"] if c["dtype"] == "int64" and c["size"] == 256), None)
    r = (
        None
        if cell is None
        else ratio(median(cell["methods"]["fetch_to_host"]), median(cell["methods"]["non_blocking"]))
    )
    out.append(
        _report.check(
            "fetch 256 int64: fetch_to_host / to(non_blocking)+event host time",
            r,
            "<= %g" % FETCH_OVER_NON_BLOCKING_AT_256,
            None if r is None else r <= FETCH_OVER_NON_BLOCKING_AT_256,
        )
    )
    stats = report["pinstage_stats"]
    for key in ("overflows", "waits"):
        out.append(
            _report.check(
                "%s with the default ring over the whole run" % key,
                stats[key],
                "== 0",
                stats[key] == 0,
                "peak in flight %d of %d bytes" % (stats["peak_in_flight_bytes"], stats["ring_bytes"]),
            )
        )
    return out


def plot_gpu(path, report):
    panels = []
    for mode in ("idle", "busy"):
        lines = {}
        for cell in (c for c in report["sections"]["lists"] if c["dtype"] == "int64"):
            for name, res in cell["methods"].items():
                if median(res, mode) is not None:
                    lines.setdefault(name, []).append((cell["size"], median(res, mode)))
        panels.append(("Python list of int64 -> device, GPU %s" % mode, lines))
    lines = {}
    for cell in (c for c in report["sections"]["numpy"] if c["dtype"] == "int64"):
        for name, res in cell["methods"].items():
            if median(res) is not None:
                lines.setdefault(name, []).append((cell["size"], median(res)))
    panels.append(("numpy int64 -> device, GPU idle", lines))
    _report.plot_panels(path, panels, report["meta"], xlabel="values per call")


# ----------------------------------------------------------------------------------------- CPU part


def run_cpu(settings, report, quick):
    sections = report["sections"]
    sizes = LIST_SIZES[:6] if quick else LIST_SIZES
    sections["lists"] = []
    for name, dtype in LIST_DTYPES.items():
        np_dtype = NUMPY_OF[dtype]
        for size in sizes:
            values = make_values(dtype, size, random.Random(size))
            methods = [
                ("torch_tensor", lambda: torch.tensor(values, dtype=dtype)),
                ("numpy_array", lambda: torch.from_numpy(np.array(values, dtype=np_dtype))),
                ("pinstage", lambda: pinstage.stage_to_device(values, dtype, device="cpu")),
            ]
            sections["lists"].append({"dtype": name, "size": size, "methods": measure_methods(methods, settings)})
            print("  lists %-7s %6d" % (name, size), file=sys.stderr)
    sections["numpy"] = []
    before = fallbacks("cpu")
    for name, dtype in NUMPY_DTYPES.items():
        for size in NUMPY_SIZES:
            x = np.array(make_values(dtype, size, random.Random(size)), dtype=NUMPY_OF[dtype])
            methods = [
                ("from_numpy_clone", lambda: torch.from_numpy(x).to(dtype, copy=True)),
                ("pinstage", lambda: pinstage.stage_to_device(x, dtype, device="cpu")),
            ]
            sections["numpy"].append({"dtype": name, "size": size, "methods": measure_methods(methods, settings)})
    report["numpy_fallbacks"] = fallbacks("cpu") - before
    report["pinstage_stats"] = pinstage.stats(device="cpu")


def print_cpu(report):
    for dtype in LIST_DTYPES:
        print()
        print("Python list of %s -> CPU tensor (conversion only): host us per call [min-max]" % dtype)
        rows = [["size", "torch.tensor", "np.array -> from_numpy", "pinstage", "torch.tensor / pinstage"]]
        for cell in (c for c in report["sections"]["lists"] if c["dtype"] == dtype):
            m = cell["methods"]
            rows.append(
                [cell["size"]]
                + [cell_text(m[k]) for k in ("torch_tensor", "numpy_array", "pinstage")]
                + [_report.fmt_ratio(ratio(median(m["torch_tensor"]), median(m["pinstage"])))]
            )
        _report.print_table(rows)
    print_legend(["torch_tensor", "numpy_array", "pinstage"])
    print()
    print("numpy array -> CPU tensor (a copy): host us per call [min-max]")
    rows = [["dtype", "size", "from_numpy + copy", "pinstage"]]
    for cell in report["sections"]["numpy"]:
        m = cell["methods"]
        rows.append([cell["dtype"], cell["size"], cell_text(m["from_numpy_clone"]), cell_text(m["pinstage"])])
    _report.print_table(rows)


def cpu_checks(report):
    cell = next((c for c in report["sections"]["lists"] if c["dtype"] == "int64" and c["size"] == 8192), None)
    r = None if cell is None else ratio(median(cell["methods"]["torch_tensor"]), median(cell["methods"]["pinstage"]))
    return [
        _report.check(
            "no GPU, list of 8192 int64: torch.tensor / pinstage host time",
            r,
            ">= %g" % CPU_TORCH_OVER_PINSTAGE_8192,
            None if r is None else r >= CPU_TORCH_OVER_PINSTAGE_8192,
        ),
        _report.check(
            "torch.tensor fallbacks for numpy inputs", report["numpy_fallbacks"], "== 0", report["numpy_fallbacks"] == 0
        ),
    ]


def plot_cpu(path, report):
    lines = {}
    for cell in (c for c in report["sections"]["lists"] if c["dtype"] == "int64"):
        for name, res in cell["methods"].items():
            if median(res) is not None:
                lines.setdefault(name, []).append((cell["size"], median(res)))
    _report.plot_panels(path, [("Python list of int64 -> CPU tensor", lines)], report["meta"], xlabel="values per call")


# -------------------------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes, repeats and shorter loops (a smoke run)")
    p.add_argument("--repeats", type=int, default=None, help="timed loops per measurement (default 7, --quick 3)")
    p.add_argument("--loop-ms", type=float, default=None, help="length of one timed loop (default 5, --quick 1)")
    p.add_argument("--cpu-only", action="store_true", help="the conversion part only, even with a GPU")
    p.add_argument(
        "--json",
        default=os.path.join(HERE, "out", "microbench.json"),
        help="where to write all figures (a PNG plot is written beside it)",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    settings = Settings(args)
    _timing.pin_to_one_core()
    use_gpu = torch.cuda.is_available() and not args.cpu_only
    report = {
        "meta": dict(
            _report.machine_meta(),
            repeats=settings.repeats,
            loop_ms=settings.loop_ns / 1e6,
            mode="gpu" if use_gpu else "cpu",
        ),
        "sections": {},
    }
    if use_gpu:
        print("pinstage microbenchmark on %s (torch %s)" % (report["meta"]["gpu"], torch.__version__))
        run_gpu(settings, report, args.quick)
        print_gpu(report)
        checks = gpu_checks(report)
    else:
        reason = "--cpu-only given" if args.cpu_only else "no GPU is visible"
        print("pinstage microbenchmark, conversion part only (%s)" % reason)
        run_cpu(settings, report, args.quick)
        print_cpu(report)
        checks = cpu_checks(report)
    report["checks"] = checks
    _report.print_checks(checks)
    _report.write_json(args.json, report)
    (plot_gpu if use_gpu else plot_cpu)(os.path.splitext(args.json)[0] + ".png", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
