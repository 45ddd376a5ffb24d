#!/usr/bin/env python3
"""Host time per builder call, on the same requests in the same process, two state layouts by
several copy patterns:
  numpy state (BatchState's columns): pinstage (one stage_many), vLLM's CpuGpuBuffer pattern (a
      persistent pinned buffer per field, copy_to_gpu(n); unsafe on reuse, timing only) and SGLang
      0.5.23's (a pinned tensor per column, non_blocking copy);
  request objects (a Python gather each call): pinstage, pinned + non_blocking, blocking.
"layout" (pinned over requests / SGLang over numpy state) is what the numpy state buys with the
copies unchanged; "ring" (SGLang over numpy state / pinstage over numpy state) is what pinstage buys
on the same state. The logits builder has no batch state: its state column is the list builder fed
numpy arrays, and it has no vLLM or SGLang column.

    python bench/builders.py [--json out.json] [--sizes 1,8,64,256,1024] [--repeats 15]

Each builder is timed on fixed data; a sample is a loop of calls sized to about --sample-ms, after
a warm-up; the methods take their samples in turn, in an order rotated every round, with no device
synchronisation anywhere (a drift of the machine, or the GPU left idle by a blocking sample, reaches
every method alike), and the median of --repeats samples is reported in microseconds per call. No
busy kernel: "blocking" shows its conversion cost but not the wait it adds under overlap. Without a
GPU it runs on the CPU (device="cpu"), where "pinned" is a plain torch.tensor and the ratios say
nothing about staging; the output says so.
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

import _baseline_builders as baseline  # noqa: E402
import _report  # noqa: E402
import _timing  # noqa: E402
from _baselines import CpuGpuBuffer, pinned_tensor  # noqa: E402

from pinstage.builders import (  # noqa: E402
    BatchState,
    DecodeInputs,
    Request,
    SamplingBatch,
    SamplingParams,
    build_decode_inputs,
    build_logprob_indices,
    build_penalty_last_token_ids,
    build_sampling_batch,
    write_cache_indices,
)

METHODS = ["batch_state", "vllm_state", "sglang_state", "list", "pinned", "blocking"]
METHOD_TITLES = {
    "batch_state": "numpy state, pinstage",
    "vllm_state": "numpy state, vLLM CpuGpuBuffer (unsafe)",
    "sglang_state": "numpy state, SGLang pinned per column",
    "list": "requests, pinstage",
    "pinned": "requests, pinned + non_blocking",
    "blocking": "requests, blocking torch.tensor",
}
# Table headers, short enough for a 120-column terminal (the legend under the table spells them out).
METHOD_HEADERS = {
    "batch_state": "S-pinstage",
    "vllm_state": "S-vLLM",
    "sglang_state": "S-SGLang",
    "list": "R-pinstage",
    "pinned": "R-pinned",
    "blocking": "R-blocking",
}
BUILDER_TITLES = {"penalty_last_token_ids": "penalty_ids", "logits": "logits*"}
PANEL_TITLES = {"logits": "logits (numpy state, pinstage: the list builder fed numpy)"}
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


# The BatchState columns each per-step builder copies, in its order (penalties only when some request has one).
STATE_FIELDS = {
    "decode_inputs": [("last_token_ids", torch.int64), ("seq_lens", torch.int64), ("req_pool_indices", torch.int64)],
    "penalty_last_token_ids": [("last_token_ids", torch.int64)],
    "sampling": [
        ("temperatures", torch.float32),
        ("top_ps", torch.float32),
        ("top_ks", torch.int32),
        ("min_ps", torch.float32),
        ("seeds", torch.int64),
        ("penalties", torch.float32),
    ],
}


def numpy_state_calls(state, builder, device):
    """{method: call} copying the same columns as the batch-state builder the ways engines copy
    numpy state today, each giving the builder's result type (checked equal to it)."""
    fields = [(n, dt) for n, dt in STATE_FIELDS[builder] if n != "penalties" or state.need_penalties]
    buffers = {n: CpuGpuBuffer.empty(state.column(n).shape, dt, device) for n, dt in fields}

    def assemble(tensors):
        if builder == "decode_inputs":
            return DecodeInputs(*tensors)
        if builder == "penalty_last_token_ids":
            return tensors[0]
        flags = (state.is_all_greedy, state.need_top_p, state.need_top_k, state.need_min_p)
        return SamplingBatch.from_staged(tensors, with_seeds=True, with_penalties=state.need_penalties, flags=flags)

    return {
        "vllm_state": lambda: assemble([buffers[n].write(state.column(n)) for n, _ in fields]),
        "sglang_state": lambda: assemble([pinned_tensor(state.column(n), dt, device) for n, dt in fields]),
    }


def restaged_sampling(state, device):
    """BatchState.sampling_batch as a step after the batch changed: it keeps its SamplingBatch until
    then, and a cache hit is not what the other methods, which copy every call, are compared with."""
    state._staged = None
    return state.sampling_batch(enable_deterministic_sampling=True, device=device)


def _same(a, b):
    """Results of two methods are equal (tensors by value, flags and None alike)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    if hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


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

    def by_copy(pinstage_call, baseline_call):
        """The list builder's methods: pinstage's builder, and the same values copied the engines' ways."""
        return {
            "list": pinstage_call,
            "pinned": lambda: baseline_call("pinned"),
            "blocking": lambda: baseline_call("blocking"),
        }

    calls = {
        "decode_inputs": dict(
            batch_state=lambda: state.decode_inputs(device=device),
            **numpy_state_calls(state, "decode_inputs", device),
            **by_copy(
                lambda: build_decode_inputs(requests, device=device),
                lambda c: baseline.build_decode_inputs(requests, c, device),
            ),
        ),
        "penalty_last_token_ids": dict(
            batch_state=lambda: state.penalty_last_token_ids(device=device),
            **numpy_state_calls(state, "penalty_last_token_ids", device),
            **by_copy(
                lambda: build_penalty_last_token_ids(requests, device=device),
                lambda c: baseline.build_penalty_last_token_ids(requests, c, device),
            ),
        ),
        "sampling": dict(
            batch_state=lambda: restaged_sampling(state, device),
            **numpy_state_calls(state, "sampling", device),
            **by_copy(
                lambda: build_sampling_batch(params, enable_deterministic_sampling=True, device=device),
                lambda c: baseline.build_sampling_batch(params, c, device, enable_deterministic_sampling=True),
            ),
        ),
        "logits": dict(
            batch_state=lambda: build_logprob_indices(lens_np, starts_np, device=device),
            **by_copy(
                lambda: build_logprob_indices(lens, starts, device=device),
                lambda c: baseline.build_logprob_indices(lens, starts, c, device),
            ),
        ),
        "write_cache_indices": by_copy(
            lambda: write_cache_indices(*cache_args), lambda c: baseline.write_cache_indices(*cache_args, c)
        ),
    }
    for builder, methods in calls.items():
        if builder in STATE_FIELDS:
            expected = methods["batch_state"]()
            for name in ("vllm_state", "sglang_state", "list"):
                assert _same(expected, methods[name]()), "%s: %s differs from the batch state's" % (builder, name)
    return calls


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
            out.append(
                _report.check(
                    f"{builder} bs 256: batch state / pinned host time",
                    ratio,
                    f"<= {STATE_OVER_PINNED_AT_256:.2f}",
                    ratio <= STATE_OVER_PINNED_AT_256,
                )
            )
            r1, r1024 = by.get((builder, 1)), by.get((builder, 1024))
            if r1 and r1024:
                growth = r1024["us"]["batch_state"] / r1["us"]["batch_state"]
                out.append(
                    _report.check(
                        f"{builder}: batch state bs 1024 / bs 1",
                        growth,
                        f"<= {STATE_1024_OVER_1:g}",
                        growth <= STATE_1024_OVER_1,
                    )
                )
        ratio = r256["us"]["pinned"] / r256["us"]["list"]
        out.append(
            _report.check(
                f"{builder} bs 256: pinned / list-of-requests host time",
                ratio,
                f">= {PINNED_OVER_LIST_AT_256:g}",
                ratio >= PINNED_OVER_LIST_AT_256,
            )
        )
    return out


def print_table(rows, repeats):
    table = [["builder", "bs"] + [METHOD_HEADERS[m] for m in METHODS] + ["layout", "ring"]]
    for r in rows:
        us = r["us"]
        cells = [_report.fmt_us_pm(us[m], r["spread"][m]) if m in us else "-" for m in METHODS]
        layout = _report.fmt_ratio(us["pinned"] / us["sglang_state"]) if "sglang_state" in us else "-"
        ring = _report.fmt_ratio(us["sglang_state"] / us["batch_state"]) if "sglang_state" in us else "-"
        table.append([BUILDER_TITLES.get(r["builder"], r["builder"]), r["bs"]] + cells + [layout, ring])
    _report.print_table(table)
    print(f"Host us per call: median ±largest distance of a sample from it, {repeats} samples per cell.")
    print("S-: numpy state (BatchState's columns), R-: request objects (a Python gather each call):")
    for m in METHODS:
        print(f"  {METHOD_HEADERS[m]:<10} {METHOD_TITLES[m]}")
    print(
        "layout = R-pinned / S-SGLang: what the numpy state buys, with the same copies;\n"
        "ring = S-SGLang / S-pinstage: what pinstage buys on the same numpy state."
    )
    print("* logits has no batch state: its S-pinstage column is the list builder fed numpy arrays.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here (and a PNG plot beside it)")
    _timing.add_sampling_args(parser, "1,8,64,256,1024")
    args = parser.parse_args()
    _timing.pin_to_one_core()

    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    meta = _report.machine_meta()
    print(
        f"Builders: host microseconds per call on {meta['gpu'] or meta['cpu']} (device={device}, torch {meta['torch']})"
    )
    if not on_gpu:
        print(
            "No GPU: this ran on the CPU, where 'pinned' is a plain torch.tensor; the ratios do not measure\n"
            "staging. Run on a GPU for the figures that count."
        )

    rows = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for bs in sizes:
        for builder, calls in builder_calls(random.Random(bs), bs, device).items():
            stats = _timing.interleaved(calls, args.repeats, args.sample_ms)
            rows.append(
                dict(
                    builder=builder,
                    bs=bs,
                    us={m: s["median_us"] for m, s in stats.items()},
                    spread={m: [s["min_us"], s["max_us"]] for m, s in stats.items()},
                )
            )
            print(f"  measured {builder} bs {bs}", file=sys.stderr, flush=True)

    print_table(rows, args.repeats)
    found = checks(rows, on_gpu)
    _report.print_checks(found)
    if args.json:
        _report.write_json(
            args.json,
            dict(
                meta=meta,
                device=device,
                repeats=args.repeats,
                sample_ms=args.sample_ms,
                methods=METHOD_TITLES,
                results=rows,
                checks=found,
            ),
        )
        panels = [
            (
                PANEL_TITLES.get(builder, builder),
                {
                    METHOD_TITLES[m]: [(r["bs"], r["us"][m]) for r in rows if r["builder"] == builder and m in r["us"]]
                    for m in METHODS
                },
            )
            for builder in sorted({r["builder"] for r in rows})
        ]
        _report.plot_panels(
            os.path.splitext(args.json)[0] + ".png",
            panels,
            meta,
            xlabel="batch size",
            title="Builders: host time per call",
            panel_width=4,
        )


if __name__ == "__main__":
    main()
