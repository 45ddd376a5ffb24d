#!/usr/bin/env python3
"""Where a decode-loop step's host time goes: each call of one backend's step timed inside
bench/decode_loop.py's loop, where other work runs between calls (not in a tight loop), medians over
the steps that make it.

A diagnostic for docs/design.md (Measuring in a loop): it wraps the loop's methods and the builder
calls it makes with timers (a perf_counter pair each, well under a microsecond, and a thread CPU
clock pair, a system call of about half a microsecond that a call's parent counts too), and the
context switches of each timed step; runs the backend
once after decode_loop's recording run, and prints per call the median, the 10th percentile and
how many steps made it. Calls nest: prefill_inputs (the admitting step's staging) holds
prefill_values (the host work the ideal does too), sampling_fields and stage_prefill, and
write_inputs (the decode step's staging) holds stage_static; prefill (the eager prefill's
launches) and the rest are outside the timed host prep. With --profile a second run goes under
torch.profiler, and each timed call's CUDA runtime calls (cudaMemcpyAsync, cudaLaunchKernel, the ring's
event records and queries) are counted with their host time: what of a call's time the driver takes.
"""

import argparse
import collections
import os
import resource
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import _timing  # noqa: E402
import decode_loop  # noqa: E402
from microbench import GpuBusy  # noqa: E402

import pinstage.builders.batch_state as batch_state  # noqa: E402

# The calls timed, in the order printed: the loop's own methods and the builders it calls.
LOOP_METHODS = ("prefill_inputs", "prefill_values", "write_inputs", "prefill", "decode", "retire", "read_back")
BUILDERS = ("sampling_fields", "stage_prefill")


def split(cfg, dev, cycles_per_us, backend, ranges=False):
    """({call: [(wall seconds, this thread's CPU seconds) per call]}, [(voluntary, involuntary) context
    switches per step]) over the timed steps of one run of `backend` (its warm-up steps and
    decode_loop's recording run, another backend, are not counted). With `ranges`, each timed call is
    also a torch.profiler range of its name.
    Wall time well above CPU time is time the thread did not run: a wait, or another thread on its
    core; equal, it is work the thread did (cold caches make it longer)."""
    samples = collections.defaultdict(list)
    step_switches = []
    counting = [False]

    def timed(fn, name):
        def call(*args, **kwargs):
            if not counting[0]:
                return fn(*args, **kwargs)
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                if ranges:
                    with torch.profiler.record_function(name):
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            finally:
                samples[name].append((time.perf_counter() - t0, time.thread_time() - c0))

        return call

    step = decode_loop.Loop.step

    def counted_step(loop):
        if loop.backend != backend:
            return step(loop)
        if not loop.prep_s:  # decode_loop clears its per-step record when the warm-up ends: so do we
            samples.clear()
            step_switches.clear()
        counting[0] = True
        before = _thread_switches()
        try:
            return step(loop)
        finally:
            counting[0] = False
            after = _thread_switches()
            if before is not None:
                step_switches.append(tuple(b - a for a, b in zip(before, after)))

    targets = [(decode_loop.Loop, name) for name in LOOP_METHODS]
    targets += [(decode_loop, name) for name in BUILDERS]
    # sampling_fields: the list builder (request objects) or the joining BatchState's (the state backends)
    targets += [(batch_state.BatchState, name) for name in ("sampling_fields", "stage_static")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, timed(fn, name))
        decode_loop.Loop.step = counted_step
        decode_loop.run_config(cfg, dev, cycles_per_us, repeats=1, backends=[backend])
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        decode_loop.Loop.step = step
    return samples, step_switches


def runtime_calls(cfg, dev, cycles_per_us, backend):
    """{timed call: [{api, per_call, host_us_per_call}]}: the CUDA runtime calls each timed call made
    (its innermost timed range), from a second run under torch.profiler (whose ranges cost time:
    this run's own timings are not reported)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        samples, _ = split(cfg, dev, cycles_per_us, backend, ranges=True)
    names = set(samples)
    events = prof.events()
    # Calls counted by their ranges: the warm-up steps' ranges are in the trace, not in `samples`.
    calls = collections.Counter(e.name for e in events if e.name in names)
    per = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in events:
        if not e.name.startswith("cuda"):
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name not in names:
            parent = parent.cpu_parent
        if parent is not None:
            entry = per[parent.name][e.name]
            entry[0] += 1
            entry[1] += e.cpu_time_total
    return {
        call: sorted(
            (
                {"api": api, "per_call": n / calls[call], "host_us_per_call": us / calls[call]}
                for api, (n, us) in apis.items()
            ),
            key=lambda r: -r["host_us_per_call"],
        )
        for call, apis in per.items()
    }


def _thread_switches():
    """(voluntary, involuntary) context switches of this thread so far; None where the OS does not
    count them per thread. Involuntary: another thread took its core (all share one here)."""
    if not hasattr(resource, "RUSAGE_THREAD"):
        return None
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw


def switches(steps):
    """Context switches per timed step (mean and share of steps with any), voluntary (a wait) and
    involuntary (preempted)."""
    if not steps:
        return None
    return {
        kind: {
            "mean": statistics.mean(s[i] for s in steps),
            "steps_with_any": sum(s[i] > 0 for s in steps) / len(steps),
        }
        for i, kind in enumerate(("voluntary", "involuntary"))
    }


def rows(samples):
    out = []
    for name in LOOP_METHODS[:3] + BUILDERS + ("stage_static",) + LOOP_METHODS[3:]:
        s = sorted(wall for wall, _ in samples.get(name, []))
        if s:
            cpu = [c for _, c in samples[name]]
            out.append(
                {
                    "call": name,
                    "n": len(s),
                    "median_us": 1e6 * statistics.median(s),
                    "p10_us": 1e6 * s[len(s) // 10],
                    "cpu_median_us": 1e6 * statistics.median(cpu),
                }
            )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--forward-ms", type=float, default=0.2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--backend", default="pinstage_static", choices=sorted(decode_loop.BACKENDS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--profile", action="store_true", help="split each call's CUDA runtime calls (a second run)")
    p.add_argument("--json", default=os.path.join(HERE, "out", "prep_split.json"))
    args = p.parse_args(argv)
    _timing.pin_to_one_core()
    dev = torch.device(args.device)
    cfg = decode_loop.Config(batch_size=args.batch_size, forward_ms=args.forward_ms, steps=args.steps)
    cycles = GpuBusy().cycles_per_us if dev.type == "cuda" else 0.0
    meta = _report.machine_meta()
    samples, step_switches = split(cfg, dev, cycles, args.backend)
    found, per_step = rows(samples), switches(step_switches)
    print(
        "\n%s on %s, bs %d, forward %.1f ms: host us per call inside the loop"
        % (args.backend, meta["gpu"] or "the CPU", args.batch_size, args.forward_ms)
    )
    _report.print_table(
        [["call", "median", "p10", "CPU median", "calls"]]
        + [
            [
                r["call"],
                _report.fmt_us(r["median_us"]),
                _report.fmt_us(r["p10_us"]),
                _report.fmt_us(r["cpu_median_us"]),
                r["n"],
            ]
            for r in found
        ]
    )
    if per_step:
        print(
            "context switches per step: voluntary %.2f (%.0f%% of steps), involuntary %.2f (%.0f%% of steps)"
            % tuple(
                v
                for k in ("voluntary", "involuntary")
                for v in (per_step[k]["mean"], 100 * per_step[k]["steps_with_any"])
            )
        )
    runtime = runtime_calls(cfg, dev, cycles, args.backend) if args.profile and dev.type == "cuda" else None
    for call, apis in (runtime or {}).items():
        print(
            "%s: CUDA runtime calls per call (host us): %s"
            % (call, ", ".join("%s x%.2f %.1f" % (a["api"], a["per_call"], a["host_us_per_call"]) for a in apis))
        )
    report = {"meta": meta, "config": vars(args), "calls": found, "context_switches": per_step}
    if runtime is not None:
        report["runtime_calls"] = runtime
    _report.write_json(args.json, report)


if __name__ == "__main__":
    main()
