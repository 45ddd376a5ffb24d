#!/usr/bin/env python3
"""pinstage microbenchmark: host time per call of turning a Python list into a device tensor.

With a GPU, every method is timed twice per sample: with the GPU idle, and with the GPU busy (a
long torch.cuda._sleep kernel queued ahead of the timed loop, so that any hidden wait for the device
shows up as host time). Methods, all measured in the same process:
  blocking   torch.tensor(values, dtype=, device=dev)
  pinned     torch.tensor(values, dtype=, pin_memory=True).to(dev, non_blocking=True)
  np_buffer  persistent pinned buffer filled through numpy, then .to(dev, non_blocking=True)
  floor      pre-filled pinned tensor, dst.copy_(pinned, non_blocking=True): no conversion at all
  pinstage   pinstage.stage_to_device(values, dtype)
plus stage_many of 10 mixed-dtype lists of 256 against 10 separate calls of each kind.

Without a GPU only the conversion part runs: stage_to_device(values, dtype, device="cpu") against
torch.tensor(values, dtype=) and np.array(values, dtype) -> torch.from_numpy.

Every sample is perf_counter_ns around a loop of N calls (N sized so one loop takes a few ms), after
a warm-up; the median over the repeats is reported in microseconds per call. Numbers go to a table on
stdout and to JSON (--json). Ratios within one run are what to compare across machines.
"""
import argparse
import datetime
import json
import os
import platform
import random
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
# Running as `python bench/microbench.py` puts bench/ (not the repo root) on sys.path; make the
# timing helper importable however the script is started.
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _timing  # noqa: E402

DEFAULT_SIZES = [1, 16, 64, 256, 1024, 8192, 65536]
SINGLE_DTYPES = {"int64": torch.int64, "float32": torch.float32}
NUMPY_DTYPES = {
    torch.bool: np.bool_,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint64: np.uint64,
    torch.float32: np.float32,
}
# The stage_many batch: the shape of one scheduler step's sampling/decode inputs (token ids, top-k,
# temperatures/top-p/min-p, seeds, a flag per request, prefix data pointers).
MANY_DTYPES = [
    torch.int64, torch.int64, torch.int32, torch.float32, torch.float32,
    torch.float32, torch.int64, torch.bool, torch.uint64, torch.int64,
]
MANY_LENGTH = 256
TOKEN_VOCAB = 152064  # a Qwen2-sized vocabulary: token ids are realistic 5-6 digit ints

# In a GPU-busy loop nothing completes, so every pinstage call in it holds ring memory until the loop
# ends. Keep one loop's staged bytes well under the default 8 MiB ring so that the ring never has to
# overflow; the per-call footprint is rounded up to an assumed alignment granule.
RING_BUDGET_BYTES = 4 << 20
RING_GRANULE_BYTES = 512

# A stream accepts only about a thousand pending copies/kernels (measured on an H200: a busy loop of
# 768 non_blocking copies queued behind a sleep did not block, 1024 did). Past that every launch
# blocks until the GPU drains, a wait that would be the benchmark's doing and not the method's, so a
# busy loop queues at most this many copies. For very cheap calls this makes a loop shorter than the
# usual few ms; the median over the repeats absorbs the extra noise.
MAX_QUEUED_COPIES = 512

MAX_SLEEP_MS = 200.0          # cap on the busy kernel
SLEEP_SAFETY = 3.0            # busy kernel length vs the idle estimate of the loop it must outlast
DEFAULT_CYCLES_PER_US = 1980  # H200 SM clock; replaced by a measurement when possible

# Targets (ratios within one run); see the issue that introduced this benchmark.
TARGET_16_PINNED_OVER_PINSTAGE = 3.0
TARGET_8192_PINNED_OVER_PINSTAGE = 10.0
TARGET_MANY_PINNED_OVER_STAGE_MANY = 10.0
TARGET_BUSY_OVER_IDLE = 1.3
TARGET_CPU_8192_TORCH_OVER_PINSTAGE = 5.0


# --------------------------------------------------------------------------------------------- setup

def import_pinstage():
    try:
        import pinstage
    except ImportError:
        # Built in place (python setup.py build_ext --inplace) but not installed.
        sys.path.insert(0, REPO_ROOT)
        try:
            import pinstage
        except ImportError as exc:
            sys.exit(
                "microbench: cannot import pinstage (%s). Build it first, e.g. "
                "`python setup.py build_ext --inplace` in %s, or pip install it." % (exc, REPO_ROOT)
            )
    return pinstage


def make_values(dtype, n, rng):
    """Python-list input shaped like what an engine stages for that dtype."""
    if dtype == torch.bool:
        return [rng.random() < 0.5 for _ in range(n)]
    if dtype.is_floating_point:
        return [rng.random() for _ in range(n)]
    if dtype == torch.uint64:
        # data pointers of cached prefix tensors: large, 4 KiB-aligned addresses
        return [0x7F00_0000_0000 + 4096 * rng.randrange(1 << 24) for _ in range(n)]
    if dtype == torch.int32:
        return [rng.randrange(1, 1024) for _ in range(n)]  # top-k like
    return [rng.randrange(TOKEN_VOCAB) for _ in range(n)]  # token ids


def cell_rng(dtype_label, size):
    # str hashes are salted per process; derive the seed from stable values instead
    return random.Random(size * 1000 + sorted(SINGLE_DTYPES).index(dtype_label))


def ring_footprint(nbytes):
    return max(RING_GRANULE_BYTES, -(-nbytes // RING_GRANULE_BYTES) * RING_GRANULE_BYTES)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class Settings:
    def __init__(self, args):
        self.repeats = args.repeats if args.repeats else (3 if args.quick else 7)
        loop_ms = args.loop_ms if args.loop_ms else (1.0 if args.quick else 5.0)
        self.loop_ns = int(loop_ms * 1e6)
        self.estimate_ns = int(0.2e6 if args.quick else 1e6)
        self.min_calls = 2 if args.quick else 4


# ----------------------------------------------------------------------------------------- GPU busy

class GpuBusy:
    """Keeps the current stream busy with torch.cuda._sleep ahead of a timed loop."""

    def __init__(self):
        self.cycles_per_us = self._measure_cycles_per_us()

    @staticmethod
    def _measure_cycles_per_us():
        # _sleep counts SM clock cycles; measure the rate rather than trust a constant, since the
        # clock differs between GPUs and power states. Fall back to the H200 figure if implausible.
        cycles = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rate = None
        for _ in range(2):  # the first round warms up the kernel and the clocks
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            rate = cycles / (start.elapsed_time(end) * 1000.0)
        if rate is None or not (200.0 <= rate <= 10_000.0):
            return float(DEFAULT_CYCLES_PER_US)
        return rate

    def sleep_us_for(self, loop_estimate_us):
        return min(MAX_SLEEP_MS * 1000.0, SLEEP_SAFETY * loop_estimate_us + 1000.0)

    def launch(self, sleep_us):
        """Queue the busy kernel and an event behind it; event.query() still False after the timed
        loop proves the GPU stayed busy for the whole loop."""
        torch.cuda._sleep(int(sleep_us * self.cycles_per_us))
        done = torch.cuda.Event()
        done.record()
        return done


# ------------------------------------------------------------------------------------------ measure

def measure(call, settings, busy=None, max_calls=None, copies_per_call=1):
    """Median host time per call, GPU idle (and GPU busy when `busy` is given). Idle and busy loops
    use the same number of calls, so that the two figures are directly comparable."""
    per_call_ns = _timing.estimate_call_ns(call, settings.estimate_ns)
    if busy is not None:
        torch.cuda.synchronize()
        queue_cap = max(1, MAX_QUEUED_COPIES // copies_per_call)
        max_calls = queue_cap if max_calls is None else min(max_calls, queue_cap)
    n = _timing.calls_for_duration(per_call_ns, settings.loop_ns, settings.min_calls, max_calls)
    sleep_us = busy.sleep_us_for(n * per_call_ns / 1000.0) if busy is not None else None

    idle, busy_samples, covered = [], [], []
    with _timing.GcPaused():
        # Warm-up, idle and busy: the busy one also grows host-side pools (e.g. PyTorch's pinned
        # caching allocator) to the depth that a loop of in-flight copies needs.
        _timing.loop_ns(call, n)
        if busy is not None:
            torch.cuda.synchronize()
            busy.launch(sleep_us)
            _timing.loop_ns(call, n)
            torch.cuda.synchronize()
        for _ in range(settings.repeats):
            idle.append(_timing.loop_ns(call, n) / n)
            if busy is None:
                continue
            torch.cuda.synchronize()  # outside the timing: the next loop starts from an idle GPU
            done = busy.launch(sleep_us)
            elapsed = _timing.loop_ns(call, n)
            covered.append(not done.query())
            torch.cuda.synchronize()
            busy_samples.append(elapsed / n)

    result = {"calls_per_loop": n, "idle": _timing.summarize_ns(idle)}
    if busy is not None:
        result["busy"] = _timing.summarize_ns(busy_samples)
        result["busy"]["sleep_ms"] = sleep_us / 1000.0
        result["busy"]["loops_covered"] = sum(covered)
        result["busy"]["loops"] = len(covered)
    return result


def measure_safely(name, call, settings, busy=None, max_calls=None, copies_per_call=1):
    """One failing method (e.g. a dtype a peer cannot copy) must not cost the rest of a GPU round."""
    try:
        return measure(call, settings, busy, max_calls, copies_per_call)
    except Exception as exc:  # noqa: BLE001 - reported in the table and the JSON
        if busy is not None:
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
        print("  ! %s failed: %s: %s" % (name, type(exc).__name__, exc), file=sys.stderr)
        return {"error": "%s: %s" % (type(exc).__name__, exc)}


def median_us(result, mode="idle"):
    if result is None or mode not in result:
        return None
    return result[mode]["median_us"]


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def read_stats(pinstage, device):
    try:
        return pinstage.stats(device=device)
    except Exception:  # noqa: BLE001 - stats are informative here, never fatal
        return None


class StatsDelta:
    """pinstage.stats() before/after one cell, so that an overflow or wait can be located."""

    def __init__(self, pinstage, device):
        self.pinstage, self.device = pinstage, device
        self.before = read_stats(pinstage, device)

    def delta(self):
        after = read_stats(self.pinstage, self.device)
        if not self.before or not after:
            return None
        return {k: after[k] - self.before.get(k, 0) for k in ("calls", "overflows", "waits", "wraps")
                if k in after}


# ---------------------------------------------------------------------------------------- GPU part

def gpu_single_methods(pinstage, values, dtype, dev, persistent):
    n = len(values)
    pinned_buf, pinned_buf_np = persistent[dtype]
    prefilled = torch.tensor(values, dtype=dtype).pin_memory()
    floor_dst = torch.empty(n, dtype=dtype, device=dev)

    def blocking():
        torch.tensor(values, dtype=dtype, device=dev)

    def pinned():
        torch.tensor(values, dtype=dtype, pin_memory=True).to(dev, non_blocking=True)

    def np_buffer():
        # Not safe as engine code: the next call overwrites the buffer while the previous copy may
        # still be reading it (the race that pinstage's ring exists to prevent). Host timing is
        # unaffected, and the values staged here are never read.
        pinned_buf_np[:n] = values
        pinned_buf[:n].to(dev, non_blocking=True)

    def floor():
        floor_dst.copy_(prefilled, non_blocking=True)

    def staged():
        pinstage.stage_to_device(values, dtype)

    into_dst = torch.empty(n, dtype=dtype, device=dev)

    def staged_into():
        # pinstage without the device allocation (a CUDA-graph static input, say): the difference
        # to "pinstage" is what allocating the result costs.
        pinstage.stage_into(values, into_dst)

    return [("blocking", blocking), ("pinned", pinned), ("np_buffer", np_buffer),
            ("floor", floor), ("pinstage", staged), ("stage_into", staged_into)]


SINGLE_METHODS = ["blocking", "pinned", "np_buffer", "floor", "pinstage", "stage_into"]
MANY_METHODS = ["stage_many", "pinstage_x10", "pinned_x10", "np_buffer_x10", "blocking_x10"]


def many_items(rng):
    return [(make_values(dt, MANY_LENGTH, rng), dt) for dt in MANY_DTYPES]


def gpu_many_methods(pinstage, items, dev):
    buffers = []
    for values, dt in items:
        buf = torch.empty(len(values), dtype=dt, pin_memory=True)
        buffers.append((buf, buf.numpy(), values))

    def stage_many():
        pinstage.stage_many(items)

    def pinstage_x10():
        for values, dt in items:
            pinstage.stage_to_device(values, dt)

    def pinned_x10():
        for values, dt in items:
            torch.tensor(values, dtype=dt, pin_memory=True).to(dev, non_blocking=True)

    def np_buffer_x10():
        # Same caveat as np_buffer above: unsafe reuse, fine for timing.
        for buf, buf_np, values in buffers:
            buf_np[:] = values
            buf.to(dev, non_blocking=True)

    def blocking_x10():
        for values, dt in items:
            torch.tensor(values, dtype=dt, device=dev)

    return [("stage_many", stage_many), ("pinstage_x10", pinstage_x10), ("pinned_x10", pinned_x10),
            ("np_buffer_x10", np_buffer_x10), ("blocking_x10", blocking_x10)]


def warm_up(pinstage, dev, persistent, seconds=2.0):
    """Every method in turn for about `seconds`, untimed, before the first timed loop. In a GPU round
    the first sizes measured (int64, 1 to 64 values) were up to 1.6x slower for every method alike,
    the floor included, than the same sizes later in the run: the host and GPU were still leaving an
    idle state. Returns the seconds spent."""
    start = time.perf_counter()
    values = make_values(torch.int64, 16, random.Random(0))
    methods = [call for _, call in gpu_single_methods(pinstage, values, torch.int64, dev, persistent)]
    while time.perf_counter() - start < seconds:
        for call in methods:
            for _ in range(200):
                call()
        torch.cuda.synchronize()
    return round(time.perf_counter() - start, 2)


def run_gpu(pinstage, settings, sizes, report):
    dev = torch.device("cuda", torch.cuda.current_device())
    if not hasattr(torch.cuda, "_sleep"):
        print("torch.cuda._sleep is missing: GPU-busy timings skipped")
        busy = None
    else:
        busy = GpuBusy()
        report["meta"]["sleep_cycles_per_us"] = busy.cycles_per_us
    max_size = max(sizes)
    persistent = {}
    for dtype in SINGLE_DTYPES.values():
        buf = torch.empty(max_size, dtype=dtype, pin_memory=True)
        persistent[dtype] = (buf, buf.numpy())

    report["meta"]["warm_up_s"] = warm_up(pinstage, dev, persistent)
    cells = report["single"]
    for dname, dtype in SINGLE_DTYPES.items():
        for size in sizes:
            values = make_values(dtype, size, cell_rng(dname, size))
            nbytes = size * torch.empty(0, dtype=dtype).element_size()
            max_calls = max(settings.min_calls, RING_BUDGET_BYTES // ring_footprint(nbytes))
            cell = {"dtype": dname, "size": size, "methods": {}}
            deltas = StatsDelta(pinstage, dev)
            for name, call in gpu_single_methods(pinstage, values, dtype, dev, persistent):
                cell["methods"][name] = measure_safely(
                    "%s %s x%d" % (name, dname, size), call, settings, busy, max_calls)
            cell["pinstage_stats_delta"] = deltas.delta()
            cells.append(cell)
            print("  measured %-7s %6d: pinstage %s" % (
                dname, size, fmt_pair(cell["methods"]["pinstage"])), flush=True)

    items = many_items(random.Random(1234))
    nbytes = sum(ring_footprint(len(v) * torch.empty(0, dtype=dt).element_size()) for v, dt in items)
    max_calls = max(settings.min_calls, RING_BUDGET_BYTES // nbytes)
    many = {"items": [[dtype_name(dt), len(v)] for v, dt in items], "methods": {}}
    deltas = StatsDelta(pinstage, dev)
    for name, call in gpu_many_methods(pinstage, items, dev):
        copies = 1 if name == "stage_many" else len(items)
        many["methods"][name] = measure_safely(name, call, settings, busy, max_calls, copies)
    many["pinstage_stats_delta"] = deltas.delta()
    report["stage_many"] = many
    report["pinstage_stats"] = read_stats(pinstage, dev)


# ---------------------------------------------------------------------------------------- CPU part

CPU_METHODS = ["torch_tensor", "numpy", "pinstage"]
CPU_MANY_METHODS = ["stage_many", "pinstage_x10", "torch_tensor_x10"]


def run_cpu(pinstage, settings, sizes, report):
    cells = report["single"]
    for dname, dtype in SINGLE_DTYPES.items():
        np_dtype = NUMPY_DTYPES[dtype]
        for size in sizes:
            values = make_values(dtype, size, cell_rng(dname, size))
            calls = [
                ("torch_tensor", lambda: torch.tensor(values, dtype=dtype)),
                ("numpy", lambda: torch.from_numpy(np.array(values, dtype=np_dtype))),
                ("pinstage", lambda: pinstage.stage_to_device(values, dtype, device="cpu")),
            ]
            cell = {"dtype": dname, "size": size, "methods": {}}
            for name, call in calls:
                cell["methods"][name] = measure_safely(
                    "%s %s x%d" % (name, dname, size), call, settings)
            cells.append(cell)

    items = many_items(random.Random(1234))

    def pinstage_x10():
        for values, dt in items:
            pinstage.stage_to_device(values, dt, device="cpu")

    def torch_tensor_x10():
        for values, dt in items:
            torch.tensor(values, dtype=dt)

    calls = [("stage_many", lambda: pinstage.stage_many(items, device="cpu")),
             ("pinstage_x10", pinstage_x10), ("torch_tensor_x10", torch_tensor_x10)]
    many = {"items": [[dtype_name(dt), len(v)] for v, dt in items], "methods": {}}
    for name, call in calls:
        many["methods"][name] = measure_safely(name, call, settings)
    report["stage_many"] = many
    try:
        report["pinstage_stats"] = pinstage.stats(device="cpu")
    except Exception as exc:  # noqa: BLE001 - stats may have nothing to say about the CPU
        report["pinstage_stats"] = {"error": "%s: %s" % (type(exc).__name__, exc)}


# ------------------------------------------------------------------------------------------ report

def fmt_us(value):
    if value is None:
        return "-"
    if value < 10:
        return "%.2f" % value
    if value < 1000:
        return "%.1f" % value
    return "%.0f" % value


def fmt_ratio(value):
    return "-" if value is None else "%.2f" % value


def fmt_pair(result):
    if result is None or "error" in result:
        return "error"
    if "busy" not in result:
        return fmt_us(median_us(result))
    busy = result["busy"]
    # '*': in some busy samples the kernel had finished before the loop did, i.e. the loop waited
    # for the GPU (expected for the blocking peer) or outran the kernel's sizing.
    mark = "*" if busy["loops_covered"] < busy["loops"] else ""
    return "%s / %s%s" % (fmt_us(median_us(result)), fmt_us(median_us(result, "busy")), mark)


def print_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths))  # noqa: E731
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def cell_by(report, dtype, size):
    for cell in report["single"]:
        if cell["dtype"] == dtype and cell["size"] == size:
            return cell
    return None


def print_size_tables(report, methods, method_headers, ratio_columns):
    """One table per dtype: a row per size, each method's figures, then the ratio columns
    (header, function of the cell's methods)."""
    for dname in SINGLE_DTYPES:
        print()
        print("[%s]" % dname)
        rows = []
        for cell in report["single"]:
            if cell["dtype"] != dname:
                continue
            m = cell["methods"]
            rows.append([cell["size"]] + [fmt_pair(m[k]) for k in methods]
                        + [fmt_ratio(column(m)) for _, column in ratio_columns])
        print_table(["size"] + list(method_headers) + [h for h, _ in ratio_columns], rows)


def report_gpu(report):
    meta = report["meta"]
    print()
    print("Host time per call, microseconds, median of %d loops: GPU idle / GPU busy  (%s, torch %s)"
          % (meta["repeats"], meta["gpu"], meta["torch"]))
    print_size_tables(report, SINGLE_METHODS, SINGLE_METHODS, [
        ("pinned/pinstage(idle)", lambda m: ratio(median_us(m["pinned"]), median_us(m["pinstage"]))),
        ("pinstage busy/idle", lambda m: ratio(median_us(m["pinstage"], "busy"), median_us(m["pinstage"]))),
    ])

    many = report["stage_many"]["methods"]
    print()
    print("[stage_many: 10 lists of %d, dtypes %s]"
          % (MANY_LENGTH, ",".join(dtype_name(d) for d in MANY_DTYPES)))
    rows = [[name, fmt_pair(many[name]),
             fmt_ratio(ratio(median_us(many[name]), median_us(many["stage_many"])))]
            for name in MANY_METHODS]
    print_table(["method", "idle / busy us", "x stage_many(idle)"], rows)
    print("(np_buffer peers reuse one pinned buffer while earlier copies may still read it: timing "
          "only, not a safe pattern)")
    print("(* after a busy figure: in some samples the busy kernel ended before the timed loop did,"
          " i.e. the loop waited for the GPU)")


def report_cpu(report):
    meta = report["meta"]
    print()
    print("Conversion only (device='cpu'): host time per call, microseconds, median of %d loops "
          "(torch %s)" % (meta["repeats"], meta["torch"]))
    print_size_tables(report, CPU_METHODS, ["torch.tensor", "np.array->from_numpy", "pinstage"], [
        ("torch.tensor/pinstage", lambda m: ratio(median_us(m["torch_tensor"]), median_us(m["pinstage"]))),
        ("numpy/pinstage", lambda m: ratio(median_us(m["numpy"]), median_us(m["pinstage"]))),
    ])
    many = report["stage_many"]["methods"]
    print()
    print("[stage_many, device='cpu': 10 lists of %d, mixed dtypes]" % MANY_LENGTH)
    rows = [[name, fmt_pair(many[name]),
             fmt_ratio(ratio(median_us(many[name]), median_us(many["stage_many"])))]
            for name in CPU_MANY_METHODS]
    print_table(["method", "us", "x stage_many"], rows)


def target(name, measured, limit, ok, detail=""):
    return {"name": name, "measured": measured, "limit": limit, "ok": ok, "detail": detail}


def gpu_targets(report):
    out = []
    for size, need in ((16, TARGET_16_PINNED_OVER_PINSTAGE), (8192, TARGET_8192_PINNED_OVER_PINSTAGE)):
        cell = cell_by(report, "int64", size)
        r = None if cell is None else ratio(median_us(cell["methods"]["pinned"]),
                                            median_us(cell["methods"]["pinstage"]))
        out.append(target("%d int64: pinstage <= 1/%g of pinned (idle)" % (size, need),
                          r, ">= %g (pinned/pinstage)" % need,
                          None if r is None else r >= need))
    many = report["stage_many"]["methods"]
    r = ratio(median_us(many["pinned_x10"]), median_us(many["stage_many"]))
    out.append(target("stage_many 10x%d <= 1/%g of 10 pinned calls (idle)"
                      % (MANY_LENGTH, TARGET_MANY_PINNED_OVER_STAGE_MANY),
                      r, ">= %g (10 pinned/stage_many)" % TARGET_MANY_PINNED_OVER_STAGE_MANY,
                      None if r is None else r >= TARGET_MANY_PINNED_OVER_STAGE_MANY))

    # No hidden wait: pinstage's busy/idle at every size, both dtypes, and for stage_many.
    worst, worst_where, uncovered = None, "", []
    checks = [("%s x%d" % (c["dtype"], c["size"]), c["methods"]["pinstage"]) for c in report["single"]]
    checks += [("stage_many", many["stage_many"]), ("pinstage_x10", many["pinstage_x10"])]
    for where, res in checks:
        r = ratio(median_us(res, "busy"), median_us(res))
        if r is None:
            worst_where = worst_where or "(missing: %s)" % where
            continue
        if worst is None or r > worst:
            worst, worst_where = r, where
        if res["busy"]["loops_covered"] < res["busy"]["loops"]:
            uncovered.append(where)
    detail = "worst at %s" % worst_where
    if uncovered:
        detail += "; busy kernel ended before the loop in some samples of: %s" % ", ".join(uncovered)
    out.append(target("pinstage busy/idle <= %g at every size" % TARGET_BUSY_OVER_IDLE,
                      worst, "<= %g" % TARGET_BUSY_OVER_IDLE,
                      None if worst is None else worst <= TARGET_BUSY_OVER_IDLE, detail))

    stats = report.get("pinstage_stats") or {}
    for key in ("overflows", "waits"):
        v = stats.get(key)
        out.append(target("zero %s with the default ring (whole run)" % key, v, "== 0",
                          None if v is None else v == 0,
                          "peak_in_flight_bytes=%s of ring_bytes=%s"
                          % (stats.get("peak_in_flight_bytes"), stats.get("ring_bytes"))))
    return out


def cpu_targets(report):
    cell = cell_by(report, "int64", 8192)
    r = None if cell is None else ratio(median_us(cell["methods"]["torch_tensor"]),
                                        median_us(cell["methods"]["pinstage"]))
    return [target("no GPU: 8192 Python ints via stage_to_device(device='cpu') >= %gx faster than "
                   "torch.tensor" % TARGET_CPU_8192_TORCH_OVER_PINSTAGE,
                   r, ">= %g (torch.tensor/pinstage)" % TARGET_CPU_8192_TORCH_OVER_PINSTAGE,
                   None if r is None else r >= TARGET_CPU_8192_TORCH_OVER_PINSTAGE)]


def print_targets(targets):
    print()
    print("Targets")
    for t in targets:
        verdict = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[t["ok"]]
        measured = "-" if t["measured"] is None else (
            "%.2f" % t["measured"] if isinstance(t["measured"], float) else str(t["measured"]))
        line = "  [%-12s] %s: measured %s, need %s" % (verdict, t["name"], measured, t["limit"])
        if t["detail"]:
            line += "  (%s)" % t["detail"]
        print(line)


# -------------------------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer repeats and shorter loops (smoke test, used by the tests)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                   default=DEFAULT_SIZES, help="comma-separated list lengths (default %s)"
                   % ",".join(map(str, DEFAULT_SIZES)))
    p.add_argument("--repeats", type=int, default=None,
                   help="timed loops per measurement, median reported (default 7, --quick 3)")
    p.add_argument("--loop-ms", type=float, default=None,
                   help="target duration of one timed loop (default 5, --quick 1)")
    p.add_argument("--cpu-only", action="store_true",
                   help="run the conversion part only, even where a GPU is visible")
    p.add_argument("--json", default=os.path.join(HERE, "out", "microbench.json"),
                   help="where to write all numbers (default bench/out/microbench.json)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    pinstage = import_pinstage()
    settings = Settings(args)
    sizes = sorted(set(args.sizes))
    use_gpu = torch.cuda.is_available() and not args.cpu_only

    report = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "gpu": torch.cuda.get_device_name() if use_gpu else None,
            "pinstage_file": getattr(pinstage, "__file__", None),
            "pinstage_version": getattr(pinstage, "__version__", None),
            "mode": "gpu" if use_gpu else "cpu",
            "repeats": settings.repeats,
            "loop_ms": settings.loop_ns / 1e6,
            "sizes": sizes,
            "max_queued_copies_per_busy_loop": MAX_QUEUED_COPIES,
            "ring_budget_bytes_per_busy_loop": RING_BUDGET_BYTES,
        },
        "single": [],
    }

    if use_gpu:
        print("pinstage microbenchmark on %s (torch %s)" % (report["meta"]["gpu"], torch.__version__))
        run_gpu(pinstage, settings, sizes, report)
        report_gpu(report)
        targets = gpu_targets(report)
    else:
        reason = ("--cpu-only given" if args.cpu_only
                  else "no GPU is visible (torch.cuda.is_available() is False)")
        report["meta"]["gpu_skipped"] = reason
        print("GPU part SKIPPED: %s. Running the conversion part only." % reason)
        run_cpu(pinstage, settings, sizes, report)
        report_cpu(report)
        targets = cpu_targets(report)

    report["targets"] = targets
    print_targets(targets)
    stats = report.get("pinstage_stats")
    print()
    print("pinstage.stats() at the end: %s" % (json.dumps(stats, sort_keys=True) if stats else "n/a"))

    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1, sort_keys=False)
    print("wrote %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
