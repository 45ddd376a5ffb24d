#!/usr/bin/env python3
"""Host time of SGLang 0.5.23's own per-step functions, as shipped and with
pinstage.integrations.sglang enabled, in one process on the same batches:

  from_schedule_batch   SamplingBatchInfo.from_schedule_batch (no penalties: its penalizers stay idle)
  prepare_for_decode    ScheduleBatch.prepare_for_decode with penalties (last-token ids, KV slots)
  write_cache_indices   mem_cache.allocation.write_cache_indices over the prefill's requests
  pruned_states         LogitsProcessor._get_pruned_states with input logprobs (sample and logprob indices)

    python bench/sglang_host.py [--json out.json] [--plot out.png] [--sizes 1,8,64,256,1024] [--repeats 15]

SGLang's source comes as in the tests (bench/engines/source.py: .engines/sglang-0.5.23, the cache or
the wheel), imported with bench/engines/sglang_stubs.py. A sample is a loop of calls after a warm-up; the
two variants take their samples in turn, the order swapped every round, and the median of --repeats
samples is reported in us per call. With a GPU, every patched function is also called once per
size with a long kernel queued and torch.cuda.set_sync_debug_mode("error"): it must return before
the kernel ends (no hidden wait). Without a GPU everything runs on the CPU, where SGLang's pinned
copies are plain tensors and write_cache_indices takes its per-request .item() path: the ratios say
little about the GPU.
"""

import argparse
import contextlib
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import _report  # noqa: E402
import _timing  # noqa: E402

from bench.engines import sglang_stubs  # noqa: E402
from bench.engines.sglang_stubs import PREFIXES, VERSION  # noqa: E402
from bench.engines.source import Unavailable, engine_root  # noqa: E402
from pinstage.integrations import sglang as pinstage_sglang  # noqa: E402

FUNCTIONS = ["from_schedule_batch", "prepare_for_decode", "write_cache_indices", "pruned_states"]
VARIANTS = {"sglang": "SGLang 0.5.23", "pinstage": "SGLang + pinstage"}
TARGET_AT_256 = 1 / 3  # from_schedule_batch with pinstage over without, at batch size 256, on a GPU
DECODE_CALLS = 4  # decode steps per sample: each allocates a KV slot per request
BUSY_CYCLES = 50_000_000  # ~25 ms on an H200: far longer than any call timed here


def prefilled(sg, device, bs, vocab_size, decode_steps, penalties):
    """A prefilled SGLang batch of bs requests with input logprobs, one output token each."""
    rng = random.Random(bs)
    world = sglang_stubs.SchedulerWorld(
        sg,
        device,
        rows=bs + 8,
        max_context_len=64 + decode_steps,
        kv_slots=bs * (64 + decode_steps),
        vocab_size=vocab_size,
    )
    reqs = []
    for _ in range(bs):
        params = {
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "top_p": rng.choice([1.0, 0.9]),
            "top_k": rng.choice([-1, 20]),
            "max_new_tokens": 4096,
        }
        if penalties:
            params.update(frequency_penalty=rng.choice([0.0, 0.5]), repetition_penalty=rng.choice([1.0, 1.1]))
        req = world.request(
            [rng.randrange(vocab_size) for _ in range(rng.randint(4, 48))],
            params,
            return_logprob=True,
            logprob_start_len=rng.choice([-1, 0, 2]),
        )
        world.admit(req)
        reqs.append(req)
    batch = world.prefill_batch(reqs)
    for r in reqs:
        r.output_ids.append(rng.randrange(vocab_size))
    return world, batch


def make_calls(sg, device, bs, vocab_size, decode_steps):
    """{function: call}: decoding on a batch with penalties, the others on one without."""
    world, batch = prefilled(sg, device, bs, vocab_size, decode_steps, penalties=False)
    reqs = batch.reqs
    _, decoding = prefilled(sg, device, bs, vocab_size, decode_steps, penalties=True)

    prefixes = [sg.allocation._prefix_kv_indices(batch, r) for r in reqs]
    lens = {
        name: torch.tensor(values, dtype=torch.int64)
        for name, values in [
            ("prefix", batch.prefix_lens),
            ("seq", [r.extend_end for r in reqs]),
            ("extend", batch.extend_lens),
        ]
    }
    rows_cpu = batch.req_pool_indices_cpu
    cache_args = (
        batch.out_cache_loc,
        rows_cpu.to(device),
        rows_cpu,
        lens["prefix"].to(device),
        lens["prefix"],
        lens["seq"].to(device),
        lens["seq"],
        lens["extend"].to(device),
        lens["extend"],
        prefixes,
        world.pool,
    )

    metadata = sglang_stubs.logits_metadata(sg, batch)
    hidden = torch.zeros(sum(batch.extend_lens), 8, device=device)
    return {
        "from_schedule_batch": lambda: sg.SamplingBatchInfo.from_schedule_batch(batch, vocab_size),
        "prepare_for_decode": decoding.prepare_for_decode,
        "write_cache_indices": lambda: sg.allocation.write_cache_indices(*cache_args),
        "pruned_states": lambda: sg.LogitsProcessor._get_pruned_states(None, hidden, None, None, metadata),
    }


def waits_for_gpu(call):
    """True when `call` waited for a long kernel queued before it (or synchronised: sync-debug
    "error" makes that raise)."""
    torch.cuda._sleep(BUSY_CYCLES)
    done = torch.cuda.Event()
    done.record()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    waited = done.query()
    torch.cuda.synchronize()
    return waited


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _timing.add_sampling_args(parser, "1,8,64,256,1024", sample_ms=20.0)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args()
    _timing.pin_to_one_core()
    sizes = [int(s) for s in args.sizes.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab_size = 32000 if device == "cuda" else 4096

    try:
        sg = sglang_stubs.import_sglang(engine_root("sglang", VERSION, PREFIXES))
    except Unavailable as why:
        sys.exit("sglang_host: %s" % why)
    warmups = 2
    decode_steps = DECODE_CALLS * 2 * (args.repeats + warmups) + 16  # every decode call of the run, with margin
    calls = {bs: make_calls(sg, device, bs, vocab_size, decode_steps) for bs in sizes}

    loops = {}  # (function, bs) -> calls per sample: about --sample-ms of SGLang's own time
    for variant in ("pinstage", "sglang"):
        with pinstage_sglang.enabled() if variant == "pinstage" else contextlib.nullcontext():
            for bs in sizes:
                for name in FUNCTIONS:
                    decode = name == "prepare_for_decode"  # each call grows the batch: a fixed count
                    for _ in range(warmups):
                        _timing.loop_ns(calls[bs][name], DECODE_CALLS if decode else 1)
                    if variant == "sglang":
                        loops[name, bs] = (
                            DECODE_CALLS
                            if decode
                            else _timing.calls_for_duration(
                                _timing.estimate_call_ns(calls[bs][name]), args.sample_ms * 1e6
                            )
                        )

    samples = {(v, name, bs): [] for v in VARIANTS for name in FUNCTIONS for bs in sizes}
    for round_ in range(args.repeats):
        for variant in ("sglang", "pinstage") if round_ % 2 == 0 else ("pinstage", "sglang"):
            with pinstage_sglang.enabled() if variant == "pinstage" else contextlib.nullcontext(), _timing.GcPaused():
                for bs in sizes:
                    for name in FUNCTIONS:
                        n = loops[name, bs]
                        samples[variant, name, bs].append(_timing.loop_ns(calls[bs][name], n) / n)

    waited = {}
    if device == "cuda":
        with pinstage_sglang.enabled():
            for bs in sizes:
                for name in FUNCTIONS:
                    try:
                        waited[name, bs] = "waited" if waits_for_gpu(calls[bs][name]) else "no wait"
                    except RuntimeError as exc:  # sync-debug "error" refused a synchronising call
                        waited[name, bs] = "synchronised: %s" % str(exc).splitlines()[0]

    report(args, sizes, samples, waited, device)


def report(args, sizes, samples, waited, device):
    meta = _report.machine_meta()
    meta["sglang"] = VERSION
    results = {key: _timing.summarize_ns(values) for key, values in samples.items()}
    rows = [["function", "bs", "SGLang us", "+ pinstage us", "ratio", "GPU busy, patched"]]
    ratio = {}
    for name in FUNCTIONS:
        for bs in sizes:
            base, ours = results["sglang", name, bs], results["pinstage", name, bs]
            ratio[name, bs] = ours["median_us"] / base["median_us"]
            rows.append(
                [
                    name,
                    bs,
                    _report.fmt_us_pm(base["median_us"], (base["min_us"], base["max_us"])),
                    _report.fmt_us_pm(ours["median_us"], (ours["min_us"], ours["max_us"])),
                    _report.fmt_ratio(ratio[name, bs]),
                    waited.get((name, bs), "-"),
                ]
            )
    print(
        "SGLang %s host time per call (%s; median of %d samples)" % (VERSION, meta["gpu"] or "CPU only", args.repeats)
    )
    _report.print_table(rows)
    checks = []
    if 256 in sizes:
        measured = ratio["from_schedule_batch", 256]
        checks.append(
            _report.check(
                "from_schedule_batch at bs 256, with/without pinstage",
                measured,
                "<= %.2f on a GPU" % TARGET_AT_256,
                measured <= TARGET_AT_256 if device == "cuda" else None,
                "" if device == "cuda" else "CPU run: no pinned copies to save",
            )
        )
    if waited:
        bad = sorted("%s@%d" % key for key, verdict in waited.items() if verdict != "no wait")
        checks.append(
            _report.check("patched functions that waited for a busy GPU", len(bad), "0", not bad, ", ".join(bad))
        )
    _report.print_checks(checks)
    if args.json:
        _report.write_json(
            args.json,
            {
                "meta": meta,
                "sizes": sizes,
                "checks": checks,
                "results": [{"variant": v, "function": f, "bs": bs, **results[v, f, bs]} for (v, f, bs) in results],
                "gpu_busy": [{"function": f, "bs": bs, "verdict": verdict} for (f, bs), verdict in waited.items()],
            },
        )
    if args.plot:
        panels = [
            (name, {VARIANTS[v]: [(bs, results[v, name, bs]["median_us"]) for bs in sizes] for v in VARIANTS})
            for name in FUNCTIONS
        ]
        _report.plot_panels(args.plot, panels, meta, xlabel="batch size", title="SGLang %s, host time" % VERSION)


if __name__ == "__main__":
    main()
