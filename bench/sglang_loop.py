#!/usr/bin/env python3
"""SGLang 0.5.23's scheduler step, from its own code, around a device forward of fixed length: tokens
per second and host time per step with pinstage.integrations.sglang disabled and enabled, in one
process, rounds alternating.

    python bench/sglang_loop.py [--batch-sizes 1,8,64,256,1024] [--forward-ms 0.2,1,5] [--steps 60]
        [--admit-every 10] [--repeats 5] [--only 64x1,256x5] [--sync] [--quick] [--out bench/out]

Per step, as SGLang's Scheduler.get_next_batch_to_run / run_batch do it (SGLang's real code, from the
source the tests load: bench/engines/source.py, imported with bench/engines/sglang_stubs.py):
  - the prefill of the step before is filtered (filter_batch) and joins the running batch (merge_batch),
    and the running batch drops its finished requests (filter_batch);
  - an admitting step: every --admit-every steps, max(1, bs/8) new requests are matched against the
    radix cache (Req.init_next_round_input) and prefilled: ScheduleBatch.init_new, prepare_for_extend
    (alloc_for_extend with write_cache_indices, SamplingBatchInfo.from_schedule_batch with the
    penalizer orchestrator), and the logits processor's pruned indices for the input logprobs
    (LogitsProcessor._get_pruned_states) when a request asks for them;
  - a decode step: prepare_for_decode (the penalizers' last tokens, alloc_for_decode, lengths);
  - overlap_utils.resolve_forward_inputs (prefill input ids to the device, decode ids gathered) and
    SamplingBatchInfo.copy_for_forward (run_batch's: the penalties accumulated for the sampler);
  - the forward.
Requests come with mixed sampling settings, a quarter with input logprobs, some with penalties, half
with a prefix in the radix cache; their lengths are staggered so that about as many finish between
two admissions as are admitted (the batch stays near its size). The batch size of a configuration is
that of the first prefill, which runs before the timed steps.

Replaced by the fixed forward (one torch.cuda._sleep of --forward-ms, its cycles per microsecond
measured first; on a machine without CUDA, nothing): the model runner (ForwardBatch.init_new in
forward_batch_info.py with its own host-to-device copies, the CUDA graph runner and its static
inputs), the attention backend and its metadata, the model, the logits processor's device work and
the sampler. The sampled tokens are chosen on the host (a fixed function of step and row), and the
wait for them is a CUDA event: after launching step k the loop waits for step k-1's forward (SGLang's
overlap schedule, its default: the host prepares step k+1 while the device runs step k), or for step
k's own with --sync. Not run either: tokenizer and detokenizer traffic, the admission policy (the
schedule above is fixed), chunked prefill, retraction, grammars, speculative decoding, result
processing beyond appending each token and the length finish (no logprob outputs or streaming), the
release of finished requests' KV (the pools are sized so that nothing is freed), the overlap
FutureMap's relay (a zero buffer stands in for the tokens decode gathers) and the scheduler's
separate stream (one stream).

Measured per round: tokens/s (tokens generated in the timed steps over their wall time, up to the
last forward's end), host microseconds per step (the scheduler's work from the step's start to the
forward's launch, averaged over the decode steps and over the admitting steps; a decode step that
merges the last prefill counts as a decode step) and the steps at whose scheduling's end the forward
before had already ended (the device waited for the host; overlap schedule on CUDA only). Reported:
medians over --repeats rounds per variant, the ratio of the medians and the spread of the per-round
ratios. Both variants must hand the forward the same batches: before the timed rounds (and warming
up both) each configuration runs once per variant, side by side --admit-every steps at a time, with
everything SGLang keeps of the batch (fields, request table rows, sampling info, penalizer state)
and the pruned indices captured after every step's launch, the first prefill's included, and
compared exactly (a difference stops the run); every timed round's final running batch must equal
that run's. On CUDA that run's scheduling also runs under torch's sync-debug "warn" mode: where each
variant synchronised with the device (file:line, count) is reported. Output: the table and checks
printed; sglang_loop.json, .md and .png in --out. GC is paused during the timed steps.
"""

import argparse
import collections
import contextlib
import os
import random
import statistics
import sys
import time
import types
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import _report  # noqa: E402
import _timing  # noqa: E402

import pinstage  # noqa: E402
from bench.engines import sglang_stubs  # noqa: E402
from bench.engines.sglang_snapshot import plain, snapshot  # noqa: E402
from bench.engines.sglang_stubs import PREFIXES, VERSION  # noqa: E402
from bench.engines.source import Unavailable, engine_root  # noqa: E402
from pinstage.integrations import sglang as pinstage_sglang  # noqa: E402

VARIANTS = {"sglang": "SGLang %s" % VERSION, "pinstage": "SGLang + pinstage"}
TOKENS_TARGET = 1.00  # enabled / disabled tokens/s, at least, everywhere
DECODE_HOST_TARGET = 0.8  # enabled / disabled host us per decode step, at most, from DECODE_HOST_FROM_BS
DECODE_HOST_FROM_BS = 64
REPLACED = (
    "the model runner (ForwardBatch.init_new, CUDA graphs), the attention backend, the model, the logits "
    "processor's device work and the sampler: one torch.cuda._sleep of the forward's length (nothing on a CPU); "
    "sampled tokens chosen on the host, their wait a CUDA event"
)
NOT_RUN = (
    "tokenizer/detokenizer traffic, the admission policy (a fixed schedule), chunked prefill, retraction, "
    "grammars, speculative decoding, result processing beyond each token and the length finish, the release of "
    "finished requests' KV, the FutureMap relay (a zero buffer), the scheduler's own stream"
)
VOCAB = 32000
CPU_VOCAB = 1024  # the smoke run's: SGLang's penalizers keep batch x vocab tensors
PROMPT_TOKENS = (4, 48)
PREFIX_TOKENS = (8, 32)


class Workload:
    """One configuration's requests as plain specs, the same for every round and variant."""

    def __init__(self, bs, steps, admit_every, vocab, seed):
        rng = random.Random(seed)
        self.vocab = vocab
        self.per_admit = max(1, bs // 8)
        # The initial requests finish spread over `horizon` steps: per_admit of them per admit_every.
        self.horizon = admit_every * bs // self.per_admit
        self.prefixes = [[rng.randrange(3, vocab) for _ in range(rng.randint(*PREFIX_TOKENS))] for _ in range(4)]
        lengths = [1 + self.horizon * (j + 1) // bs for j in range(bs)]
        rng.shuffle(lengths)
        self.initial = [self._spec(rng, n) for n in lengths]
        self.arrivals = {
            s: [self._spec(rng, self.horizon) for _ in range(self.per_admit)]
            for s in range(admit_every, steps, admit_every)
        }
        self.rows = bs + self.per_admit * len(self.arrivals) + 8
        self.max_context = PREFIX_TOKENS[1] + PROMPT_TOKENS[1] + self.horizon + 8

    def _spec(self, rng, max_new_tokens):
        prompt = rng.choice(self.prefixes) if rng.random() < 0.5 else []
        prompt = prompt + [rng.randrange(3, self.vocab) for _ in range(rng.randint(*PROMPT_TOKENS))]
        params = {
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "top_p": rng.choice([1.0, 0.9]),
            "top_k": rng.choice([-1, 20]),
            "min_p": rng.choice([0.0, 0.0, 0.05]),
            "max_new_tokens": max_new_tokens,
        }
        if rng.random() < 0.3:
            params.update(frequency_penalty=0.5, repetition_penalty=rng.choice([1.0, 1.1]))
        logprob = rng.random() < 0.25
        start = rng.choice([-1, 0, rng.randrange(len(prompt))]) if logprob else -1
        return prompt, params, logprob, start


class Forward:
    """The fixed forward: a sleep kernel and an event; waits one step late (overlap) or at once."""

    def __init__(self, device, forward_ms, cycles_per_us, overlap):
        self.cuda = device == "cuda"
        self.cycles = int(forward_ms * 1000.0 * cycles_per_us)
        self.overlap = overlap
        self.pending = None

    def run(self):
        if not self.cuda:
            return
        if self.cycles:
            torch.cuda._sleep(self.cycles)
        done = torch.cuda.Event()
        done.record()
        if self.overlap:
            done, self.pending = self.pending, done
        if done is not None:
            done.synchronize()

    def ran_dry(self):
        """Overlap: whether the forward in flight had ended (the device waits for the host); None
        where that is not known (no GPU, --sync: the device waits for every step's scheduling)."""
        return self.pending.query() if self.pending is not None else None

    def drain(self):
        if self.cuda:
            torch.cuda.synchronize()
        self.pending = None


class Round:
    """One run of a configuration's workload on a fresh scheduler world, step by step."""

    def __init__(self, sg, device, workload, forward):
        self.sg, self.workload, self.forward = sg, workload, forward
        world = sglang_stubs.SchedulerWorld(
            sg,
            device,
            rows=workload.rows,
            max_context_len=workload.max_context,
            kv_slots=workload.rows * workload.max_context,
            vocab_size=workload.vocab,
        )
        for prefix in workload.prefixes:
            world.cache_prompt(prefix)
        self.world = world
        self.initial = [self._request(spec) for spec in workload.initial]
        self.arrivals = {s: [self._request(spec) for spec in specs] for s, specs in workload.arrivals.items()}
        # The logits processor's input: one row per token a prefill extends, at most its prompts' tokens.
        groups = [workload.initial, *workload.arrivals.values()]
        self.hidden = torch.zeros(max(sum(len(spec[0]) for spec in g) for g in groups), 1, device=device)
        # resolve_forward_inputs gathers decode input ids from the overlap FutureMap's token buffer.
        self.future_map = types.SimpleNamespace(
            output_tokens_buf=torch.zeros(world.pool.req_to_token.shape[0], dtype=torch.int64, device=device),
            spec_algo=sg.SpeculativeAlgorithm.NONE,
        )
        self.resolve = sg.overlap_utils.resolve_forward_inputs
        self.finish = sg.schedule_batch.FINISH_LENGTH
        self.running = None
        self.last_prefill = None

    def _request(self, spec):
        prompt, params, logprob, start = spec
        return self.world.request(prompt, dict(params), return_logprob=logprob, logprob_start_len=start)

    def fill(self):
        """The first prefill (the whole batch, step -1), its forward and the device's end: not timed."""
        self.run_step(-1, self.initial)
        self.forward.drain()

    def run_step(self, index, admit, capture=None, syncs=None):
        """One scheduler step and its forward; returns (host ns, tokens, whether the device had run
        dry by the end of the scheduling). `capture(batch, pruned)` is called between the forward's
        launch and the step's tokens; with `syncs` (a list, CUDA only), the scheduling runs under
        torch's sync-debug "warn" mode and where it synchronised (file:line) goes there."""
        if syncs is None:
            elapsed, batch, pruned = self.schedule(index, admit)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    elapsed, batch, pruned = self.schedule(index, admit)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            where = (
                "%s:%d" % (os.path.basename(w.filename), w.lineno) for w in caught if "synchroniz" in str(w.message)
            )
            syncs.extend(where)
        dry = self.forward.ran_dry()
        self.forward.run()
        if capture is not None:
            capture(batch, pruned)
        return elapsed, self.sampled(batch, index), dry

    def schedule(self, index, admit):
        """The step's scheduling, timed: (host ns, the batch the forward gets, pruned indices or None)."""
        sg = self.sg
        start = time.perf_counter_ns()
        last, running = self.last_prefill, self.running
        if last is not None:  # get_next_batch_to_run: the last prefill joins the running batch
            last.filter_batch(reqs_to_exclude=[])
            if not last.is_empty():
                if running is None or running.is_empty():
                    running = last
                else:
                    running.merge_batch(last)
            self.last_prefill = None
        if running is not None:
            running.filter_batch()
        pruned = None
        if admit:
            for req in admit:
                self.world.admit(req)
            batch = self.world.prefill_batch(admit)
            self.resolve(batch, self.future_map)
            if batch.return_logprob:
                metadata = sglang_stubs.logits_metadata(sg, batch)
                pruned = sg.LogitsProcessor._get_pruned_states(
                    None, self.hidden[: batch.extend_num_tokens], None, None, metadata
                )
            self.last_prefill = batch
        else:
            if running is None or running.is_empty():
                raise RuntimeError("step %d: nothing to decode (the workload left the batch empty)" % index)
            batch = running
            batch.prepare_for_decode()
            self.resolve(batch, self.future_map)
        # run_batch's _forward_isolation: the forward's sampling info, its penalties accumulated
        batch.sampling_info.copy_for_forward()
        elapsed = time.perf_counter_ns() - start
        self.running = running
        return elapsed, batch, pruned

    def sampled(self, batch, index):
        """The step's tokens, as the result processing records them; returns how many."""
        finish, vocab = self.finish, self.workload.vocab
        base = index * 131
        for i, req in enumerate(batch.reqs):
            req.output_ids.append(3 + (base + i) % (vocab - 3))
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                req.finished_reason = finish(length=req.sampling_params.max_new_tokens)
        # Overlap: the next step's input ids are relayed on the device, never staged from the host.
        batch.input_ids = None
        return len(batch.reqs)

    def final(self):
        """The running batch after the last step (the last prefill merged in), as plain data."""
        running = self.running
        if self.last_prefill is not None:
            self.last_prefill.filter_batch(reqs_to_exclude=[])
            if running is None or running.is_empty():
                running = self.last_prefill
            else:
                running.merge_batch(self.last_prefill)
            self.last_prefill = None
        return snapshot(running)


def variant_context(variant):
    return pinstage_sglang.enabled() if variant == "pinstage" else contextlib.nullcontext()


def timed_round(sg, device, workload, forward, steps):
    """The untimed first prefill, then `steps` timed steps: the round's figures and final batch."""
    before = pinstage.stats(device)
    rnd = Round(sg, device, workload, forward)
    rnd.fill()
    host = {"decode": [], "admit": []}
    tokens = dry_steps = 0
    with _timing.GcPaused():
        start = time.perf_counter_ns()
        for index in range(steps):
            admit = rnd.arrivals.get(index)
            elapsed, made, dry = rnd.run_step(index, admit)
            tokens += made
            host["admit" if admit else "decode"].append(elapsed)
            dry_steps += bool(dry)
        forward.drain()
        wall_ns = time.perf_counter_ns() - start
    after = pinstage.stats(device)
    return {
        "tokens": tokens,
        "wall_s": wall_ns / 1e9,
        "tokens_per_s": tokens / (wall_ns / 1e9),
        "decode_host_us": statistics.fmean(host["decode"]) / 1000.0 if host["decode"] else None,
        "admit_host_us": statistics.fmean(host["admit"]) / 1000.0 if host["admit"] else None,
        "decode_steps": len(host["decode"]),
        "admit_steps": len(host["admit"]),
        "final_batch_size": len(rnd.running.reqs),
        "device_ran_dry_steps": dry_steps if forward.overlap and forward.cuda else None,
        # the round's staging through pinstage (first prefill included): none where disabled
        **{"pinstage_" + k: after[k] - before[k] for k in ("calls", "copies", "overflows", "fallbacks")},
    }, rnd.final()


def check_identical(sg, device, workload, forward, steps, chunk):
    """Runs the workload once per variant, side by side `chunk` steps at a time (the variant
    switched between chunks), and compares what every step, the first prefill included, hands the
    forward: everything SGLang keeps of the batch and the pruned indices. Raises AssertionError at
    the first difference. Returns (steps compared, of which with pruned indices, the final batch,
    {variant: {file:line: synchronising calls its scheduling made there} (CUDA; else None)})."""
    rounds = {}
    for variant in VARIANTS:
        with variant_context(variant):
            rounds[variant] = Round(sg, device, workload, forward)
    chunks = [range(-1, 0)] + [range(first, min(steps, first + chunk)) for first in range(0, steps, chunk)]
    compared = pruned = 0
    syncs = {variant: [] if device == "cuda" else None for variant in VARIANTS}
    for indices in chunks:
        seen = {}
        for variant, rnd in rounds.items():
            seen[variant] = []
            keep = seen[variant].append
            with variant_context(variant):
                for index in indices:
                    admit = rnd.initial if index < 0 else rnd.arrivals.get(index)
                    rnd.run_step(
                        index,
                        admit,
                        lambda batch, pruned, index=index: keep(
                            (index, snapshot(batch), [plain(x) for x in pruned] if pruned else None)
                        ),
                        syncs[variant],
                    )
                forward.drain()
        for (index, want, want_pruned), (_, got, got_pruned) in zip(seen["sglang"], seen["pinstage"]):
            different = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            assert not different, "step %d: with pinstage the batch differs from SGLang's in %s" % (index, different)
            assert want_pruned == got_pruned, "step %d: with pinstage the pruned indices differ from SGLang's" % index
            compared += 1
            pruned += want_pruned is not None
    finals = {variant: rnd.final() for variant, rnd in rounds.items()}
    assert compared == steps + 1 and finals["sglang"] == finals["pinstage"], "the final running batches differ"
    return (
        compared,
        pruned,
        finals["sglang"],
        {v: None if m is None else dict(collections.Counter(m)) for v, m in syncs.items()},
    )


def run_config(sg, device, bs, forward_ms, cycles_per_us, args):
    vocab = VOCAB if device == "cuda" else CPU_VOCAB
    workload = Workload(bs, args.steps, args.admit_every, vocab, seed=bs)
    forward = Forward(device, forward_ms, cycles_per_us, overlap=not args.sync)
    compared, pruned, expected_final, syncs = check_identical(
        sg, device, workload, forward, args.steps, args.admit_every
    )
    rounds = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for variant in _timing.rotated(list(VARIANTS), r):
            with variant_context(variant):
                result, final = timed_round(sg, device, workload, forward, args.steps)
            assert final == expected_final, "%s: a timed round's final batch differs from the checked run's" % variant
            assert (result["pinstage_calls"] > 0) == (variant == "pinstage"), (variant, result["pinstage_calls"])
            rounds[variant].append(result)
    return {
        "batch_size": bs,
        "forward_ms": forward_ms,
        "steps_compared": compared,
        "steps_compared_with_pruned_indices": pruned,
        "synchronising_calls_in_scheduling": syncs,  # over the checked run: the host waited for the device
        "rounds": rounds,
    }


# ---------------------------------------------------------------------------------------- report


def summarize(row):
    """Medians per variant, ratios of the medians and the per-round ratios' spread."""
    out = {}
    for key in ("tokens_per_s", "decode_host_us", "admit_host_us"):
        med = {}
        for variant, rounds in row["rounds"].items():
            values = [r[key] for r in rounds if r[key] is not None]
            med[variant] = statistics.median(values) if values else None
        paired = [
            p[key] / s[key]
            for s, p in zip(row["rounds"]["sglang"], row["rounds"]["pinstage"])
            if s[key] and p[key] is not None
        ]
        ratio = med["pinstage"] / med["sglang"] if med["sglang"] and med["pinstage"] is not None else None
        out[key] = {
            "median": med,
            "ratio": ratio,
            "ratio_min": min(paired, default=None),
            "ratio_max": max(paired, default=None),
        }
    return out


def fmt_ratio(entry):
    return _report.fmt_ratio_range(entry["ratio"], (entry["ratio_min"], entry["ratio_max"]))


def sync_text(row):
    """The checked run's synchronising calls in the scheduling, per variant, or None (CPU)."""
    syncs = row["synchronising_calls_in_scheduling"]
    if syncs["sglang"] is None:
        return None
    parts = []
    for variant, sites in syncs.items():
        top = ", ".join("%s x%d" % kv for kv in sorted(sites.items(), key=lambda kv: -kv[1])[:4])
        parts.append("%s %d%s" % (variant, sum(sites.values()), " (%s)" % top if top else ""))
    return "; ".join(parts)


def table_rows(rows):
    header = [
        "bs",
        "forward ms",
        "tokens/s SGLang",
        "+ pinstage",
        "ratio",
        "host us/decode step SGLang",
        "+ pinstage",
        "ratio",
        "host us/admitting step SGLang",
        "+ pinstage",
        "ratio",
        "device ran dry, steps",
    ]
    out = [header]
    for row in rows:
        s = row["summary"]
        line = [row["batch_size"], "%g" % row["forward_ms"] if row["forward_ms"] else "none"]
        for key, fmt in (("tokens_per_s", "%.0f"), ("decode_host_us", None), ("admit_host_us", None)):
            for variant in VARIANTS:
                value = s[key]["median"][variant]
                line.append("-" if value is None else fmt % value if fmt else _report.fmt_us(value))
            line.append(fmt_ratio(s[key]))
        dry = [[r["device_ran_dry_steps"] for r in row["rounds"][v]] for v in VARIANTS]
        line.append("-" if None in dry[0] else "%g / %g" % tuple(statistics.median(d) for d in dry))
        out.append(line)
    return out


def markdown(rows, meta, settings, checks):
    lines = [
        "# SGLang %s scheduler loop, pinstage disabled and enabled" % VERSION,
        "",
        "%s, torch %s; %s. %d timed steps per round (an admitting step every %d), %d round(s) per variant, "
        "alternating; %s schedule. Medians over rounds; ratio = pinstage / SGLang, [min-max of the per-round ratios]."
        % (
            meta["gpu"] or "CPU only (smoke: no forward)",
            meta["torch"],
            meta["date"],
            settings["steps"],
            settings["admit_every"],
            settings["repeats"],
            settings["schedule"],
        ),
        "",
        "Replaced by the fixed forward: %s. Not run: %s." % (REPLACED, NOT_RUN),
        "",
    ]
    lines += [_report.markdown_table(table_rows(rows)), ""]
    syncs = [(row, sync_text(row)) for row in rows]
    if any(text for _, text in syncs):
        lines.append(
            "Synchronising calls in the scheduling over the checked run (torch sync-debug; file:line x count):"
        )
        lines.append("")
        for row, text in syncs:
            lines.append("- bs %d, forward %g ms: %s" % (row["batch_size"], row["forward_ms"], text))
        lines.append("")
    lines.append(_report.markdown_checks(checks))
    return "\n".join(lines) + "\n"


def make_checks(rows, device):
    on_gpu = device == "cuda"
    why = "" if on_gpu else "CPU smoke run: no forward, nothing to compare"
    tokens = [(r["batch_size"], r["forward_ms"], r["summary"]["tokens_per_s"]["ratio"]) for r in rows]
    worst = min(tokens, key=lambda t: t[2])
    decode = [
        (r["batch_size"], r["forward_ms"], r["summary"]["decode_host_us"]["ratio"])
        for r in rows
        if r["batch_size"] >= DECODE_HOST_FROM_BS and r["summary"]["decode_host_us"]["ratio"] is not None
    ]
    compared = sum(r["steps_compared"] for r in rows)
    pruned = sum(r["steps_compared_with_pruned_indices"] for r in rows)
    checks = [
        _report.check(
            "steps whose batches pinstage and SGLang handed the forward were compared",
            compared,
            "every step identical",
            True,  # a difference stops the run
            "every step of every configuration; %d of them with the logits processor's pruned indices" % pruned,
        ),
        _report.check(
            "tokens/s, pinstage / SGLang, lowest",
            round(worst[2], 3),
            ">= %.2f at every configuration" % TOKENS_TARGET,
            all(t[2] >= TOKENS_TARGET for t in tokens) if on_gpu else None,
            why or "at bs %d, forward %g ms" % worst[:2],
        ),
    ]
    if decode:
        top = max(decode, key=lambda t: t[2])
        checks.append(
            _report.check(
                "host us per decode step, pinstage / SGLang, highest at bs >= %d" % DECODE_HOST_FROM_BS,
                round(top[2], 3),
                "<= %.2f" % DECODE_HOST_TARGET,
                all(t[2] <= DECODE_HOST_TARGET for t in decode) if on_gpu else None,
                why or "at bs %d, forward %g ms" % top[:2],
            )
        )
    return checks


def plot(path, rows, meta):
    forwards = sorted({r["forward_ms"] for r in rows})
    panels = []
    for ms in forwards:
        lines = {}
        for key, label in (
            ("tokens_per_s", "tokens/s"),
            ("decode_host_us", "host us / decode step"),
            ("admit_host_us", "host us / admitting step"),
        ):
            lines[label] = [
                (r["batch_size"], r["summary"][key]["ratio"])
                for r in rows
                if r["forward_ms"] == ms and r["summary"][key]["ratio"] is not None
            ]
        panels.append(("forward %s: pinstage / SGLang" % ("%g ms" % ms if ms else "none"), lines))
    ms = forwards[-1]
    panels.append(
        (
            "host us per decode step, forward %s" % ("%g ms" % ms if ms else "none"),
            {
                VARIANTS[v]: [
                    (r["batch_size"], r["summary"]["decode_host_us"]["median"][v])
                    for r in rows
                    if r["forward_ms"] == ms and r["summary"]["decode_host_us"]["median"][v] is not None
                ]
                for v in VARIANTS
            },
        )
    )
    _report.plot_panels(
        path,
        panels,
        meta,
        xlabel="batch size",
        ylabel="pinstage / SGLang (last panel: us)",
        title="SGLang %s scheduler loop" % VERSION,
        yscale="linear",
        panel_width=4.2,
    )


DEFAULTS = {"batch_sizes": "1,8,64,256,1024", "forward_ms": "0.2,1,5", "steps": 60, "admit_every": 10, "repeats": 5}
QUICK = {"batch_sizes": "1,64", "forward_ms": "0.2", "steps": 20, "admit_every": 5, "repeats": 2}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", help="default %(batch_sizes)s" % DEFAULTS)
    p.add_argument("--forward-ms", help="the fixed forward's lengths, CUDA only (default %(forward_ms)s)" % DEFAULTS)
    p.add_argument("--only", help="configurations to run, as BSxMS pairs: 64x1,1024x0.2 (instead of the two lists)")
    p.add_argument("--steps", type=int, help="timed steps per round (default %(steps)d)" % DEFAULTS)
    p.add_argument(
        "--admit-every", type=int, help="an admitting step every this many (default %(admit_every)d)" % DEFAULTS
    )
    p.add_argument("--repeats", type=int, help="timed rounds per variant (default %(repeats)d)" % DEFAULTS)
    p.add_argument("--sync", action="store_true", help="wait for each forward at once (default: one step late)")
    p.add_argument("--quick", action="store_true", help="a short run; what is not given: %s" % QUICK)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=os.path.join(HERE, "out"), help="folder for sglang_loop.json, .md, .png")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.only:
        configs = []
        for pair in args.only.split(","):
            bs, _, ms = pair.partition("x")
            configs.append((int(bs), float(ms or 0)))
    else:
        configs = [(int(bs), float(ms)) for ms in args.forward_ms.split(",") for bs in args.batch_sizes.split(",")]
    if args.device != "cuda":  # no forward to time: one length, nothing
        configs = list(dict.fromkeys((bs, 0.0) for bs, _ in configs))
    if args.steps <= args.admit_every or args.admit_every < 1 or args.repeats < 1 or min(bs for bs, _ in configs) < 1:
        p.error("need --steps > --admit-every >= 1, --repeats >= 1 and batch sizes >= 1")
    return args, configs


def main(argv=None):
    args, configs = parse_args(argv)
    device = args.device
    try:
        sg = sglang_stubs.import_sglang(engine_root("sglang", VERSION, PREFIXES))
    except Unavailable as why:
        sys.exit("sglang_loop: %s" % why)
    threads = torch.get_num_threads()
    if device != "cuda":  # the scheduler's host work is one thread; on a busy machine others only contend
        torch.set_num_threads(1)
    try:
        return run(args, configs, sg, device)
    finally:
        torch.set_num_threads(threads)


def run(args, configs, sg, device):
    cycles_per_us = 0.0
    measured = {}
    if device == "cuda":
        from microbench import GpuBusy

        cycles_per_us = GpuBusy().cycles_per_us  # measured (a fallback outside the plausible range)
        for ms in sorted({ms for _, ms in configs}):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(int(ms * 1000 * cycles_per_us))
            end.record()
            end.synchronize()
            measured["%g" % ms] = start.elapsed_time(end)
    meta = _report.machine_meta()
    meta.update(sglang=VERSION, sleep_cycles_per_us=cycles_per_us, forward_ms_measured=measured)
    settings = {
        "steps": args.steps,
        "admit_every": args.admit_every,
        "repeats": args.repeats,
        "schedule": "sync" if args.sync else "overlap",
        "device": device,
        "replaced": REPLACED,
        "not_run": NOT_RUN,
    }
    print(
        "SGLang %s scheduler loop on %s: %d configuration(s), %d timed steps per round, %d round(s) per variant"
        % (VERSION, meta["gpu"] or "the CPU (smoke: no forward)", len(configs), args.steps, args.repeats)
    )
    rows = []
    began = time.perf_counter()
    for bs, ms in configs:
        row = run_config(sg, device, bs, ms, cycles_per_us, args)
        row["summary"] = summarize(row)
        rows.append(row)
        s = row["summary"]
        print(
            "  bs %4d forward %-4s tokens/s %s, host/decode step %s, host/admitting step %s"
            % (
                bs,
                "%g" % ms if ms else "none",
                fmt_ratio(s["tokens_per_s"]),
                fmt_ratio(s["decode_host_us"]),
                fmt_ratio(s["admit_host_us"]),
            ),
            file=sys.stderr,
        )
        if sync_text(row):
            print("    synchronising calls in the scheduling: %s" % sync_text(row), file=sys.stderr)
    settings["seconds"] = round(time.perf_counter() - began, 1)
    print()
    _report.print_table(table_rows(rows))
    print("(ratio: pinstage / SGLang of the medians over rounds, [min-max of the per-round ratios])")
    print("Replaced by the fixed forward: %s. Not run: %s." % (REPLACED, NOT_RUN))
    checks = make_checks(rows, device)
    _report.print_checks(checks)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "sglang_loop")
    _report.write_json(base + ".json", {"meta": meta, "settings": settings, "results": rows, "checks": checks})
    with open(base + ".md", "w") as f:
        f.write(markdown(rows, meta, settings, checks))
    print("wrote %s.md" % base)
    plot(base + ".png", rows, meta)
    return rows, checks


if __name__ == "__main__":
    main()
