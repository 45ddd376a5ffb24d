#!/usr/bin/env python3
"""Where a decode-loop step's host time goes: each call of one backend's step timed inside
bench/decode_loop.py's loop, where other work runs between calls (not in a tight loop), medians over
the steps that make it.

A diagnostic for docs/design.md (Measuring in a loop): it wraps the loop's methods and the builder
calls it makes with timers (a perf_counter pair each, well under a microsecond), runs the backend
once after decode_loop's recording run, and prints per call the median, the 10th percentile and
how many steps made it. Calls nest: prefill_inputs (the admitting step's staging) holds
prefill_values (the host work the ideal does too), the builders and one stage_many, and
write_inputs (the decode step's staging) holds stage_static; prefill (the eager prefill's
launches) and the rest are outside the timed host prep."""

import argparse
import collections
import os
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
BUILDERS = ("logprob_index_tensors", "sampling_fields", "write_cache_indices")


def split(cfg, dev, cycles_per_us, backend):
    """{call: [seconds per call]} over the timed steps of one run of `backend` (its warm-up steps and
    decode_loop's recording run, another backend, are not counted)."""
    samples = collections.defaultdict(list)
    counting = [False]

    def timed(fn, name):
        def call(*args, **kwargs):
            if not counting[0]:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                samples[name].append(time.perf_counter() - t0)

        return call

    step = decode_loop.Loop.step

    def counted_step(loop):
        if loop.backend != backend:
            return step(loop)
        if not loop.prep_s:  # decode_loop clears its per-step record when the warm-up ends: so do we
            samples.clear()
        counting[0] = True
        try:
            return step(loop)
        finally:
            counting[0] = False

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
    return samples


def rows(samples):
    out = []
    for name in LOOP_METHODS[:3] + BUILDERS + ("stage_static",) + LOOP_METHODS[3:]:
        s = sorted(samples.get(name, []))
        if s:
            out.append(
                {"call": name, "n": len(s), "median_us": 1e6 * statistics.median(s), "p10_us": 1e6 * s[len(s) // 10]}
            )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--forward-ms", type=float, default=0.2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--backend", default="pinstage_static", choices=sorted(decode_loop.BACKENDS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=os.path.join(HERE, "out", "prep_split.json"))
    args = p.parse_args(argv)
    _timing.pin_to_one_core()
    dev = torch.device(args.device)
    cfg = decode_loop.Config(batch_size=args.batch_size, forward_ms=args.forward_ms, steps=args.steps)
    cycles = GpuBusy().cycles_per_us if dev.type == "cuda" else 0.0
    meta = _report.machine_meta()
    found = rows(split(cfg, dev, cycles, args.backend))
    print(
        "\n%s on %s, bs %d, forward %.1f ms: host us per call inside the loop"
        % (args.backend, meta["gpu"] or "the CPU", args.batch_size, args.forward_ms)
    )
    _report.print_table(
        [["call", "median", "p10", "calls"]]
        + [[r["call"], _report.fmt_us(r["median_us"]), _report.fmt_us(r["p10_us"]), r["n"]] for r in found]
    )
    _report.write_json(args.json, {"meta": meta, "config": vars(args), "calls": found})


if __name__ == "__main__":
    main()
