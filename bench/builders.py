"""Host time per builder call for the three backends (pinstage, pinned, blocking).

    python bench/builders.py [--json out.json] [--sizes 1,8,64,256,1024] [--repeats 15]

Each builder is called on the same request data with each backend; a timed sample is a loop of calls
sized to about --sample-ms, after a warm-up, the methods take their samples in turn (round-robin),
and the median of --repeats samples is reported in
microseconds per call, with ratio columns pinned/pinstage and blocking/pinstage. A fourth column,
"py-gather", is the pinstage backend's staging fed by the Python gather that "pinned" and "blocking"
use (one stage_many): it splits the gain between staging and the native gather. The GPU is idle
(no busy kernel), so "blocking" shows its conversion cost but not the wait it adds under overlap.
Without a GPU it runs on the CPU (device="cpu"), where "pinned" is a plain torch.tensor and the
ratios say nothing about staging; the output says so.
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pinstage.builders import (  # noqa: E402
    BACKENDS,
    Request,
    SamplingParams,
    build_decode_inputs,
    build_logprob_indices,
    build_penalty_last_token_ids,
    build_sampling_batch,
    write_cache_indices,
)
from pinstage.builders._backend import stage  # noqa: E402
from pinstage.builders.cache import stage_cache_index_plan_lists  # noqa: E402
from pinstage.builders.decode import decode_input_items, last_token_ids  # noqa: E402
from pinstage.builders.logits import logprob_index_arrays  # noqa: E402
from pinstage.builders.sampling import stage_sampling_items  # noqa: E402
from pinstage import _C  # noqa: E402

import _timing  # noqa: E402  (bench/, on sys.path as the script's folder)


def decode_requests(rng, bs):
    return [
        Request(
            [rng.randrange(1 << 17) for _ in range(rng.randint(16, 64))],
            [rng.randrange(1 << 17) for _ in range(rng.randint(1, 32))],
            req_pool_idx=i,
        )
        for i in range(bs)
    ]


def sampling_params(rng, bs):
    # A few distinct settings per batch, as requests from a handful of client configurations give.
    return [
        SamplingParams(
            temperature=rng.choice([0.7, 1.0]),
            top_p=rng.choice([0.9, 1.0]),
            top_k=rng.choice([-1, 40]),
            min_p=rng.choice([0.0, 0.05]),
            sampling_seed=rng.choice([None, 1234]),
        )
        for _ in range(bs)
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
    """name -> (function(backend) making one builder call on fixed data, function() doing the same
    work with the Python gather staged by pinstage.stage_many)."""
    requests = decode_requests(rng, bs)
    params = sampling_params(rng, bs)
    lens, starts = logprob_batch(rng, bs)
    cache_args = cache_batch(rng, bs, device)

    def cache_with_python_plan():
        rows, prefixes, lengths, offsets, pointers = stage_cache_index_plan_lists(*cache_args, "pinstage", None)
        _C.write_cache_indices(cache_args[0], rows, pointers, prefixes, lengths, offsets, cache_args[-1], None)

    return {
        "decode_inputs": (
            lambda b: build_decode_inputs(requests, backend=b, device=device),
            lambda: stage(decode_input_items(requests), "pinstage", None, device),
        ),
        "penalty_last_token_ids": (
            lambda b: build_penalty_last_token_ids(requests, backend=b, device=device),
            lambda: stage([(last_token_ids(requests), torch.int64)], "pinstage", None, device),
        ),
        "sampling": (
            lambda b: build_sampling_batch(params, enable_deterministic_sampling=True, backend=b, device=device),
            lambda: stage_sampling_items(params, True, "pinstage", None, device),
        ),
        "logits": (
            lambda b: build_logprob_indices(lens, starts, backend=b, device=device),
            lambda: stage([(v, torch.int64) for v in logprob_index_arrays(lens, starts)], "pinstage", None, device),
        ),
        "cache": (lambda b: write_cache_indices(*cache_args, backend=b), cache_with_python_plan),
    }


def median_call_us(calls, repeats, sample_ms):
    """name -> call: median microseconds per call of each, over `repeats` samples taken in turn (one
    sample of each call per round), so that drifts in the machine's speed reach every call alike."""
    loops = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        loops[name] = _timing.calls_for_duration(_timing.estimate_call_ns(call, 100_000), sample_ms * 1e6)
    samples = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            samples[name].append(_timing.loop_ns(call, loops[name]) / loops[name] / 1e3)
    return {name: statistics.median(s) for name, s in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--sizes", default="1,8,64,256,1024")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=5.0)
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    where = torch.cuda.get_device_name() if on_gpu else f"CPU ({platform.processor() or platform.machine()})"
    print(f"builders host time, device={device}: {where}; torch {torch.__version__}")
    if not on_gpu:
        print("NOTE: no GPU, so this ran on the CPU; 'pinned' is plain torch.tensor here and the ratios do "
              "not measure staging. Run on a GPU for the numbers that count.")

    rows = []
    for bs in (int(s) for s in args.sizes.split(",")):
        calls = builder_calls(random.Random(bs), bs, device)
        for name, (call, python_gather_call) in calls.items():
            methods = {b: (lambda b=b: call(b)) for b in BACKENDS}
            methods["py_gather"] = python_gather_call
            us = median_call_us(methods, args.repeats, args.sample_ms)
            if on_gpu:
                torch.cuda.synchronize()
            rows.append(dict(builder=name, bs=bs, **{f"{b}_us": us[b] for b in us},
                             pinned_over_pinstage=us["pinned"] / us["pinstage"],
                             blocking_over_pinstage=us["blocking"] / us["pinstage"],
                             pinned_over_py_gather=us["pinned"] / us["py_gather"]))

    header = (f"{'builder':<24}{'bs':>6}{'pinstage us':>13}{'py-gather us':>14}{'pinned us':>11}{'blocking us':>13}"
              f"{'pinned/ps':>11}{'blocking/ps':>13}{'pinned/py-g':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['builder']:<24}{r['bs']:>6}{r['pinstage_us']:>13.1f}{r['py_gather_us']:>14.1f}{r['pinned_us']:>11.1f}"
              f"{r['blocking_us']:>13.1f}{r['pinned_over_pinstage']:>11.2f}{r['blocking_over_pinstage']:>13.2f}"
              f"{r['pinned_over_py_gather']:>13.2f}")

    if args.json:
        report = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            command=" ".join([os.path.basename(sys.executable)] + sys.argv),
            device=device, device_name=where, torch=torch.__version__, python=platform.python_version(),
            repeats=args.repeats, sample_ms=args.sample_ms, results=rows,
        )
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
