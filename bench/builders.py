#!/usr/bin/env python3
"""Host time per builder call: pinstage on batch state, pinstage on a list of requests, and the
pinned and blocking patterns engines use today, on the same requests in the same process.

    python bench/builders.py [--json out.json] [--sizes 1,8,64,256,1024] [--repeats 15]

Each builder is timed on fixed data; a sample is a loop of calls sized to about --sample-ms, after
a warm-up; the methods take their samples in turn (round-robin, so that a drift of the machine's
speed reaches all alike) and the median of --repeats samples is reported in microseconds per call.
The GPU is idle (no busy kernel): "blocking" shows its conversion cost but not the wait it adds
under overlap. Without a GPU it runs on the CPU (device="cpu"), where "pinned" is a plain
torch.tensor and the ratios say nothing about staging; the output says so.
"""
import argparse
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import _report  # noqa: E402
import _timing  # noqa: E402
from pinstage.builders import (  # noqa: E402
    BatchState, Request, SamplingParams, build_decode_inputs, build_logprob_indices, build_penalty_last_token_ids,
    build_sampling_batch, write_cache_indices,
)

METHODS = ["batch_state", "list", "pinned", "blocking"]
METHOD_TITLES = {
    "batch_state": "pinstage, batch state",
    "list": "pinstage, list of requests",
    "pinned": "pinned + non_blocking",
    "blocking": "blocking torch.tensor",
}
# Checks (ratios within one run, on a GPU).
STATE_OVER_PINNED_AT_256 = 1 / 10
STATE_1024_OVER_1 = 2.0
PINNED_OVER_LIST_AT_256 = 2.0


def decode_requests(rng, bs):
    return [
        Request(
            [rng.randrange(1 << 17) for _ in range(rng.randint(16, 64))],
            [rng.randrange(1 << 17) for _ in range(rng.randint(1, 32))],
            req_pool_idx=i,
            # A few distinct settings per batch, as requests from a handful of client configurations give.
            sampling_params=SamplingParams(
                temperature=rng.choice([0.7, 1.0]),
                top_p=rng.choice([0.9, 1.0]),
                top_k=rng.choice([-1, 40]),
                min_p=rng.choice([0.0, 0.05]),
                sampling_seed=rng.choice([None, 1234]),
                frequency_penalty=rng.choice([0.0, 0.5]),
            ),
        )
        for i in range(bs)
    ]


def logprob_batch(rng, bs):
    # Mostly sample-only rows (logprobs of the output only, or a chunked prefill), some full prompts.
    lens = [rng.randint(1, 32) for _ in range(bs)]
    starts = [n if rng.random() < 0.75 else rng.randint(0, n) for n in lens]
    return lens, starts


def cache_batch(rng, bs, device):
    prefix_lens = [rng.randint(0, 64) for _ in range(bs)]
    extend_lens = [rng.randint(1, 64) for _ in range(bs)]
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    pool = torch.randint(0, 1 << 20, (max(prefix_lens, default=0) + 1,), dtype=torch.int64, device=device)
    prefix_tensors = [pool[:p] for p in prefix_lens]
    out_cache_loc = torch.randint(0, 1 << 20, (sum(extend_lens),), dtype=torch.int64, device=device)
    table = torch.zeros((bs, 256), dtype=torch.int32, device=device)
    return table, list(range(bs)), prefix_tensors, prefix_lens, seq_lens, extend_lens, out_cache_loc


def builder_calls(rng, bs, device):
    """builder -> {method: call} on fixed data (a method a builder does not have is left out)."""
    requests = decode_requests(rng, bs)
    params = [r.sampling_params for r in requests]
    state = BatchState(capacity=bs)
    for r in requests:
        state.add(r)
    lens, starts = logprob_batch(rng, bs)
    lens_np, starts_np = np.array(lens), np.array(starts)
    cache_args = cache_batch(rng, bs, device)

    def by_backend(fn):
        return {"list": lambda: fn("pinstage"), "pinned": lambda: fn("pinned"), "blocking": lambda: fn("blocking")}

    return {
        "decode_inputs": dict(
            batch_state=lambda: state.decode_inputs(device=device),
            **by_backend(lambda b: build_decode_inputs(requests, backend=b, device=device)),
        ),
        "penalty_last_token_ids": dict(
            batch_state=lambda: state.penalty_last_token_ids(device=device),
            **by_backend(lambda b: build_penalty_last_token_ids(requests, backend=b, device=device)),
        ),
        "sampling": dict(
            batch_state=lambda: state.sampling_batch(enable_deterministic_sampling=True, device=device),
            **by_backend(lambda b: build_sampling_batch(params, enable_deterministic_sampling=True, backend=b,
                                                        device=device)),
        ),
        "logits": dict(
            batch_state=lambda: build_logprob_indices(lens_np, starts_np, device=device),
            **by_backend(lambda b: build_logprob_indices(lens, starts, backend=b, device=device)),
        ),
        "write_cache_indices": by_backend(lambda b: write_cache_indices(*cache_args, backend=b)),
    }


def measure(calls, repeats, sample_ms):
    """name -> call: per-call microsecond samples of each, taken in turn (one of each per round)."""
    loops = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        loops[name] = _timing.calls_for_duration(_timing.estimate_call_ns(call, 100_000), sample_ms * 1e6)
    samples = {name: [] for name in calls}
    with _timing.GcPaused():
        for _ in range(repeats):
            for name, call in calls.items():
                samples[name].append(_timing.loop_ns(call, loops[name]) / loops[name])
    return {name: _timing.summarize_ns(s) for name, s in samples.items()}


def checks(rows, on_gpu):
    """The checks of the builders' figures, as (what, measured, need, ok)."""
    if not on_gpu:
        return []
    by = {(r["builder"], r["bs"]): r for r in rows}
    out = []
    for builder in sorted({r["builder"] for r in rows}):
        r256 = by.get((builder, 256))
        if r256 is None:
            continue
        if "batch_state" in r256["us"]:
            ratio = r256["us"]["batch_state"] / r256["us"]["pinned"]
            out.append(_report.check(f"{builder} bs 256: batch state / pinned host time", ratio,
                                     f"<= {STATE_OVER_PINNED_AT_256:.2f}", ratio <= STATE_OVER_PINNED_AT_256))
            r1, r1024 = by.get((builder, 1)), by.get((builder, 1024))
            if r1 and r1024:
                growth = r1024["us"]["batch_state"] / r1["us"]["batch_state"]
                out.append(_report.check(f"{builder}: batch state bs 1024 / bs 1", growth,
                                         f"<= {STATE_1024_OVER_1:g}", growth <= STATE_1024_OVER_1))
        ratio = r256["us"]["pinned"] / r256["us"]["list"]
        out.append(_report.check(f"{builder} bs 256: pinned / list-of-requests host time", ratio,
                                 f">= {PINNED_OVER_LIST_AT_256:g}", ratio >= PINNED_OVER_LIST_AT_256))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here (and a PNG plot beside it)")
    parser.add_argument("--sizes", default="1,8,64,256,1024")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=5.0)
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    meta = _report.machine_meta()
    print(f"Builders: host microseconds per call on {meta['gpu'] or meta['cpu']} (device={device}, torch "
          f"{meta['torch']}), median of {args.repeats} samples, min-max in brackets")
    if not on_gpu:
        print("No GPU: this ran on the CPU, where 'pinned' is a plain torch.tensor; the ratios do not measure "
              "staging. Run on a GPU for the figures that count.")

    rows = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for bs in sizes:
        for builder, calls in builder_calls(random.Random(bs), bs, device).items():
            stats = measure(calls, args.repeats, args.sample_ms)
            if on_gpu:
                torch.cuda.synchronize()
            rows.append(dict(builder=builder, bs=bs, us={m: s["median_us"] for m, s in stats.items()},
                             spread={m: [s["min_us"], s["max_us"]] for m, s in stats.items()}))
            print(f"  measured {builder} bs {bs}", file=sys.stderr, flush=True)

    table = [["builder", "bs"] + [METHOD_TITLES[m] for m in METHODS] + ["pinned / batch state", "pinned / list"]]
    for r in rows:
        us = r["us"]
        cells = [_report.fmt_us(us[m], r["spread"][m]) if m in us else "-" for m in METHODS]
        ratios = [_report.fmt_ratio(us["pinned"] / us[m]) if m in us else "-" for m in ("batch_state", "list")]
        table.append([r["builder"], r["bs"]] + cells + ratios)
    _report.print_table(table)
    print("(batch state: BatchState's per-step builders, one stage_many of numpy column slices; list of requests: "
          "the same builders over Request objects, a Python gather plus one stage_many; logits takes numpy "
          "lengths in the batch-state column)")
    found = checks(rows, on_gpu)
    _report.print_checks(found)
    if args.json:
        _report.write_json(args.json, dict(meta=meta, device=device, repeats=args.repeats, sample_ms=args.sample_ms,
                                           methods=METHOD_TITLES, results=rows, checks=found))
        panels = [(builder, {METHOD_TITLES[m]: [(r["bs"], r["us"][m]) for r in rows if r["builder"] == builder and m in r["us"]]
                             for m in METHODS})
                  for builder in sorted({r["builder"] for r in rows})]
        _report.plot_panels(os.path.splitext(args.json)[0] + ".png", panels, meta, xlabel="batch size",
                            title="Builders: host time per call", panel_width=4)


if __name__ == "__main__":
    main()
