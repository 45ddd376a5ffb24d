#!/usr/bin/env python3
"""vLLM 0.33's default model runner (Model Runner V2) preparing its inputs, step by step, with
pinstage's vLLM plugin disabled and enabled in one process, rounds alternating.

    python bench/vllm_loop.py --out DIR [--quick] [--sizes 1,8,64,256]

What runs is vLLM's own code from the released wheel (bench/engines/vllm_stubs.py): the runner's
RequestState (states.py), BlockTables (block_table.py: StagedWriteTensor rows and, with two KV-cache
groups, FusedStagedWriter), the sampler's SamplingStates and its default logits-processor states
(PenaltiesState, LogitBiasState, BadWordsState: UvaBackedTensor and StagedWriteTensor), with their
Triton kernels. One step does what GPUModelRunner.execute_model does with them (model_runner.py is
not loaded): remove the finished requests, add the new ones (request, block and sampling state),
apply the staged writes (requests' when some joined, the sampler's every step), append a block where
a decoding request fills one, apply the block tables' writes, and stage idx_mapping and
query_start_loc with async_tensor_h2d as prepare_inputs does. The host time of that is the step;
making up the workload (which requests finish or join, their prompts and parameters, new block ids)
is not timed. The forward pass is not run; a sleeping kernel stands for it. Requests: prompts of
16-256 tokens, 32-96 output tokens, a mix of sampling parameters (some with penalties, logit bias,
min_tokens, bad words); the batch stays full, so about batch/64 requests join per step.

Every value the device reads is checked: behind each step, outside the timed part, the batch's rows
of every UvaBackedTensor, of the block tables (through vLLM's gather_block_tables kernel), of the
requests' device-written lengths and token rows, and query_start_loc are gathered on the device and
compared, after the window, with what the host wrote for that step (vLLM's own host arrays, and for
the write-only tensors what the workload appended). Steps run in windows of --in-flight steps behind
one sleep that outlasts the host's window, so the device reads step 1's values after the host has
written step --in-flight's: more steps in flight than the pools' depth (2). vLLM's own pools then
hand the device values of later steps (counted as wrong values); the plugin must give none.

Without a GPU it runs a smoke pass on the CPU (vLLM's kernels in Triton's interpreter, no pinned
memory, nothing in flight): it checks the values, its times mean nothing; without Triton it says
that it needs a GPU and exits 0. Writes vllm_loop.json, vllm_loop.md and vllm_loop.png to --out.
"""

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import _report  # noqa: E402
import _timing  # noqa: E402

POOL_DEPTH = 2  # vLLM's _DEFAULT_MAX_CONCURRENCY: the UVA pools' round-robin depth
BLOCK_SIZE = 16
MAX_MODEL_LEN = 1024
VOCAB = 32000
# Rows at the top of every per-request tensor held by requests that never run: a write whose
# indices, starts and lengths come from different steps (vLLM's pools under the race) may run past
# its row, and must stay inside vLLM's own tensors rather than hit the other mode's.
GUARD_ROWS = 16
MODES = ("vllm", "pinstage")


class Request:
    __slots__ = ("rid", "prompt", "out_len", "done", "params", "blocks", "idx")

    def __init__(self, rid, rng, groups, next_block, sampling_params):
        self.rid = rid
        self.prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(16, 256))]
        self.out_len = rng.randint(32, 96)
        self.done = 0  # tokens generated so far
        self.params = sampling_params(
            temperature=rng.choice((0.0, 0.7, 1.0)),
            top_p=rng.choice((1.0, 0.9)),
            top_k=rng.choice((0, 50)),
            min_p=rng.choice((0.0, 0.05)),
            seed=rng.randrange(1 << 62),
            frequency_penalty=0.5 if rng.random() < 0.25 else 0.0,
            repetition_penalty=1.1 if rng.random() < 0.25 else 1.0,
            logit_bias={rng.randrange(VOCAB): 1.5} if rng.random() < 0.1 else None,
            min_tokens=4 if rng.random() < 0.2 else 0,
            all_stop_token_ids={2, rng.randrange(3, VOCAB)},
            bad_words_token_ids=[[rng.randrange(VOCAB), rng.randrange(VOCAB)]] if rng.random() < 0.1 else None,
        )
        n_blocks = -(-(len(self.prompt) + 1) // BLOCK_SIZE)
        self.blocks = [[next_block() for _ in range(n_blocks)] for _ in range(groups)]
        self.idx = None


class Runner:
    """One mode's copy of the runner's state objects and its workload (same seed in both modes, so
    both run the same steps)."""

    def __init__(self, vllm, batch, max_reqs, groups, device, seed):
        self.v = vllm
        self.batch = batch
        self.groups = groups
        self.device = device
        self.rng = random.Random(seed)
        self._block = 0
        self._rid = 0
        max_blocks = MAX_MODEL_LEN // BLOCK_SIZE
        self.req_states = vllm.states.RequestState(max_reqs, MAX_MODEL_LEN, 8192, 0, VOCAB, device)
        self.block_tables = vllm.block_table.BlockTables(
            [BLOCK_SIZE] * groups, max_reqs, 8192, [max_blocks] * groups, device
        )
        self.sampling = vllm.sample_states.SamplingStates(max_reqs, VOCAB)
        lp = vllm.interface.LogitsProcRequestState.from_request_state(self.req_states)
        self.processors = [
            vllm.logit_bias.LogitBiasState(None, lp),
            vllm.penalties.PenaltiesState(None, lp),
            vllm.bad_words.BadWordsState(None, lp),
        ]
        self.query_start_loc = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        for i in range(GUARD_ROWS):  # free_indices.pop() hands out the top rows first
            self.req_states.add_request("guard-%d" % i, 1, [0], 0, 1)
        self.req_states.apply_staged_writes()
        self.active = {}  # rid -> Request, in batch order
        # the device-read tensors, by name: UvaBackedTensor (host array .np, read as .gpu)
        self.uva = {"prompt_len": self.req_states.prompt_len, "prefill_len": self.req_states.prefill_len}
        for owner in [self.sampling] + self.processors:
            for name, value in vars(owner).items():
                if isinstance(value, vllm.buffer_utils.UvaBackedTensor):
                    self.uva["%s.%s" % (type(owner).__name__, name)] = value

    def _next_block(self):
        self._block = (self._block + 1) % (1 << 24)
        return self._block

    def plan(self):
        """What the scheduler decides for the next step (not timed): the requests that finish, the
        new ones, and the block each decoding request that filled its last one gets."""
        finished = [r for r in self.active.values() if r.done >= r.out_len]
        for r in finished:
            del self.active[r.rid]
        appends = []
        for r in self.active.values():
            if r.done and (len(r.prompt) + r.done) % BLOCK_SIZE == 0:
                ids = [[self._next_block()] for _ in range(self.groups)]
                for g in range(self.groups):
                    r.blocks[g].extend(ids[g])
                appends.append((r, tuple(ids)))
        new = []
        while len(self.active) + len(new) < self.batch:
            self._rid += 1
            new.append(Request("r%d" % self._rid, self.rng, self.groups, self._next_block, self.v.SamplingParams))
        return finished, new, appends

    def step(self, finished, new, appends):
        """One runner step's input preparation with vLLM's objects (the timed part); returns what
        the device should read."""
        v, rs, bt = self.v, self.req_states, self.block_tables
        for r in finished:
            rs.remove_request(r.rid)
        for r in new:
            rs.add_request(r.rid, len(r.prompt), r.prompt, 0, r.out_len)
            r.idx = rs.req_id_to_index[r.rid]
            bt.append_block_ids(r.idx, tuple(r.blocks), overwrite=True)
            self.sampling.add_request(r.idx, r.params)
            for p in self.processors:
                p.add_request(r.idx, r.params)
            self.active[r.rid] = r
        if new:
            rs.apply_staged_writes()
        self.sampling.apply_staged_writes()
        for p in self.processors:
            p.apply_staged_writes()
        for r, ids in appends:
            bt.append_block_ids(r.idx, ids, overwrite=False)
        bt.apply_staged_writes()
        reqs = list(self.active.values())
        idx_np = np.fromiter((r.idx for r in reqs), dtype=np.intp, count=len(reqs))
        idx_mapping = v.torch_utils.async_tensor_h2d(idx_np, device=self.device, dtype=torch.int64)
        qsl = np.empty(len(self.query_start_loc), dtype=np.int32)
        qsl[0] = 0
        np.cumsum([len(r.prompt) if r.done == 0 else 1 for r in reqs], out=qsl[1 : len(reqs) + 1])
        qsl[len(reqs) + 1 :] = qsl[len(reqs)]
        v.torch_utils.async_tensor_h2d(qsl, out=self.query_start_loc)
        return reqs, new, idx_np, idx_mapping, qsl

    def done(self, reqs):
        for r in reqs:
            r.done += 1

    def device_reads(self, reqs, new, idx_np, idx_mapping, qsl):
        """Queues device reads of everything this step staged; returns [(name, device copy,
        expected numpy, mask or None)] to compare once the device is done."""
        n = len(reqs)
        reads = []
        for name, u in self.uva.items():
            gpu = u.gpu[:, idx_mapping] if u.np.ndim == 2 else u.gpu[idx_mapping]
            reads.append((name, gpu, u.np[..., idx_np].copy(), None))
        nb = self.block_tables.num_blocks
        reads.append(("BlockTables.num_blocks", nb.gpu[:, idx_mapping], nb.np[:, idx_np].copy(), None))
        tables = self.block_tables.gather_block_tables(idx_mapping, n)  # vLLM's kernel: what attention reads
        width = tables[0].shape[1]
        for g, table in enumerate(tables):
            expected = np.zeros((n, width), dtype=np.int32)
            mask = np.zeros((n, width), dtype=bool)
            for i, r in enumerate(reqs):
                expected[i, : len(r.blocks[g])] = r.blocks[g]
                mask[i, : len(r.blocks[g])] = True
            reads.append(("block_table[%d]" % g, table.clone(), expected, mask))
        rs = self.req_states
        prefill = np.array([len(r.prompt) for r in reqs], dtype=np.int32)
        reads.append(("RequestState.total_len", rs.total_len.gpu[idx_mapping], prefill, None))
        reads.append(
            ("RequestState.num_computed_tokens", rs.num_computed_tokens.gpu[idx_mapping], np.zeros_like(prefill), None)
        )
        if new:
            rows = [rs.all_token_ids.gpu[r.idx, : len(r.prompt)] for r in new]
            reads.append(
                (
                    "RequestState.all_token_ids",
                    torch.cat(rows),
                    np.concatenate([r.prompt for r in new]).astype(np.int32),
                    None,
                )
            )
        reads.append(("query_start_loc", self.query_start_loc[: n + 1].clone(), qsl[: n + 1].copy(), None))
        reads.append(("idx_mapping", idx_mapping.clone(), idx_np.astype(np.int64), None))
        return reads


def compare(reads, wrong):
    """Adds each field's count of values that differ from what the host wrote; returns (checked, wrong)."""
    checked = bad = 0
    for name, got, expected, mask in reads:
        got = got.cpu().numpy().reshape(expected.shape)
        differ = got != expected
        if mask is not None:
            differ &= mask
        count = int(differ.sum())
        checked += int(mask.sum()) if mask is not None else expected.size
        bad += count
        if count:
            wrong[name] = wrong.get(name, 0) + count
    return checked, bad


class Loop:
    def __init__(self, vllm, plugin, args, on_gpu):
        self.vllm, self.plugin, self.args, self.on_gpu = vllm, plugin, args, on_gpu
        self.cycles_per_us = 0
        if on_gpu:
            from microbench import GpuBusy

            self.cycles_per_us = GpuBusy().cycles_per_us  # measured (a fallback outside the plausible range)

    def window(self, runner, mode, sleep_ms, record):
        """--in-flight steps behind one sleep; returns (host ns per step, admitting flags, checked,
        wrong, covered, host window ns)."""
        (self.plugin.enable if mode == "pinstage" else self.plugin.disable)()
        first = None
        if self.on_gpu:
            torch.cuda._sleep(int(sleep_ms * 1000 * self.cycles_per_us))
        times, admitting, pending = [], [], []
        start = time.perf_counter_ns()
        with _timing.GcPaused():
            for i in range(self.args.in_flight):
                planned = runner.plan()
                t0 = time.perf_counter_ns()
                out = runner.step(*planned)
                times.append(time.perf_counter_ns() - t0)
                admitting.append(bool(out[1]))
                pending.append(runner.device_reads(*out))
                runner.done(out[0])
                if i == 0 and self.on_gpu:
                    first = torch.cuda.Event()
                    first.record()
        window_ns = time.perf_counter_ns() - start
        # still unread when the host had written every step of the window: all of them in flight
        covered = first is not None and not first.query()
        if self.on_gpu:
            torch.cuda.synchronize()
        wrong = record.setdefault("wrong_by_field", {})
        checked = bad = 0
        for reads in pending:
            c, b = compare(reads, wrong)
            checked, bad = checked + c, bad + b
        return times, admitting, checked, bad, covered, window_ns


def run_size(loop, batch, max_reqs):
    args, vllm = loop.args, loop.vllm
    runners = {m: Runner(vllm, batch, max_reqs, args.kv_groups, loop.device, seed=batch) for m in MODES}
    records = {m: dict(rounds=[], admit_us=[], decode_us=[], checked=0, wrong=0, windows=0, covered=0) for m in MODES}
    sleep_ms = {m: 1.0 for m in MODES}

    def one(mode, timed):
        rec = records[mode]
        times, admitting, checked, bad, covered, window_ns = loop.window(runners[mode], mode, sleep_ms[mode], rec)
        # the next window's sleep outlasts this window's host work (steps and reads) by half
        sleep_ms[mode] = min(max(1.5 * window_ns / 1e6, 0.5), 200.0)
        rec["checked"] += checked  # warm-up windows are checked too
        rec["wrong"] += bad
        rec["windows"] += 1
        rec["covered"] += int(covered)
        if timed:
            us = [t / 1000 for t in times]
            rec["rounds"].append(statistics.fmean(us))
            rec["admit_us"] += [u for u, a in zip(us, admitting) if a]
            rec["decode_us"] += [u for u, a in zip(us, admitting) if not a]

    for _ in range(args.warmup):
        for mode in MODES:
            one(mode, False)
    for r in range(args.rounds):
        for mode in _timing.rotated(list(MODES), r):
            for _ in range(args.windows):
                one(mode, True)
    loop.plugin.disable()
    rounds = {m: _per_round(records[m]["rounds"], args.windows) for m in MODES}
    ratios = [p / v for v, p in zip(rounds["vllm"], rounds["pinstage"])]
    ratio, spread = _report.median_range(ratios)
    row = dict(batch=batch, modes={}, ratio=ratio, ratio_spread=spread)
    for m in MODES:
        rec = records[m]
        step_us, step_spread = _report.median_range(rounds[m])
        row["modes"][m] = dict(
            step_us=step_us,
            step_us_spread=step_spread,
            decode_step_us=statistics.median(rec["decode_us"]) if rec["decode_us"] else None,
            admit_step_us=statistics.median(rec["admit_us"]) if rec["admit_us"] else None,
            admitting_steps=len(rec["admit_us"]),
            steps=len(rec["admit_us"]) + len(rec["decode_us"]),
            values_checked=rec["checked"],
            wrong_values=rec["wrong"],
            wrong_by_field=rec.get("wrong_by_field", {}),
            windows=rec["windows"],
            windows_in_flight=rec["covered"],
        )
    return row


def _per_round(window_means, windows):
    """Mean host us per step of each round (its --windows windows)."""
    return [statistics.fmean(window_means[i : i + windows]) for i in range(0, len(window_means), windows)]


def load(on_gpu):
    from bench.engines import vllm_stubs
    from bench.engines.source import Unavailable

    try:
        base = vllm_stubs.load_vllm()
    except Unavailable as why:
        sys.exit("vllm_loop: %s" % why)
    import importlib

    gpu = "vllm.v1.worker.gpu."
    mods = {
        "states": gpu + "states",
        "block_table": gpu + "block_table",
        "sample_states": gpu + "sample.states",
        "penalties": gpu + "sample.penalties",
        "logit_bias": gpu + "sample.logit_bias",
        "bad_words": gpu + "sample.bad_words",
        "interface": gpu + "sample.logits_processor.interface",
    }
    for key, name in mods.items():
        setattr(base, key, importlib.import_module(name))
    base.SamplingParams = vllm_stubs.SamplingParams
    return base


def table_rows(rows):
    out = [
        [
            "requests",
            "vLLM us/step",
            "pinstage us/step",
            "pinstage / vLLM",
            "decode-only (vLLM / pinstage)",
            "admitting (vLLM / pinstage)",
            "wrong values vLLM",
            "wrong values pinstage",
            "windows all in flight",
        ]
    ]
    for r in rows:
        v, p = r["modes"]["vllm"], r["modes"]["pinstage"]
        out.append(
            [
                r["batch"],
                _report.fmt_us(v["step_us"], v["step_us_spread"]),
                _report.fmt_us(p["step_us"], p["step_us_spread"]),
                _report.fmt_ratio_range(r["ratio"], r["ratio_spread"]),
                "%s / %s" % (_report.fmt_us(v["decode_step_us"]), _report.fmt_us(p["decode_step_us"])),
                "%s / %s" % (_report.fmt_us(v["admit_step_us"]), _report.fmt_us(p["admit_step_us"])),
                "%d of %d" % (v["wrong_values"], v["values_checked"]),
                "%d of %d" % (p["wrong_values"], p["values_checked"]),
                "%d/%d, %d/%d" % (v["windows_in_flight"], v["windows"], p["windows_in_flight"], p["windows"]),
            ]
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for vllm_loop.json, .md and .png")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and windows")
    parser.add_argument(
        "--sizes",
        default=None,
        help="requests per batch (default 1,8,64,256: at 1024 the untouched pools' race once ended the run "
        "with an illegal memory access; docs/integrations.md)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size, each mode once a round")
    parser.add_argument("--windows", type=int, default=None, help="windows per mode per round")
    parser.add_argument("--in-flight", type=int, default=8, help="steps per window, all in flight (> %d)" % POOL_DEPTH)
    parser.add_argument("--warmup", type=int, default=2, help="untimed windows per mode per size")
    parser.add_argument(
        "--kv-groups",
        type=int,
        default=2,
        help="KV-cache groups: 1 = StagedWriteTensor.apply_write, 2+ = FusedStagedWriter",
    )
    args = parser.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        try:
            import triton  # noqa: F401
        except ImportError:
            print("vllm_loop: needs a GPU (vLLM's Triton kernels; no GPU and no Triton interpreter here); nothing run")
            return
        # Set before vLLM's modules decorate their kernels: Triton runs them in its interpreter.
        os.environ["TRITON_INTERPRET"] = "1"
        import logging

        logging.getLogger("vllm").setLevel(logging.ERROR)  # "pinned memory is not available", per buffer
    default_sizes = "1,8,64,256" if on_gpu else "1,8"
    sizes = [int(s) for s in (args.sizes or default_sizes).split(",")]
    if on_gpu:
        args.rounds = args.rounds or (4 if args.quick else 8)
        args.windows = args.windows or (2 if args.quick else 3)
    else:
        args.rounds, args.windows, args.warmup, args.in_flight = (
            args.rounds or 2,
            args.windows or 1,
            1,
            min(args.in_flight, 3),
        )
    if on_gpu and args.in_flight <= POOL_DEPTH:
        sys.exit("vllm_loop: --in-flight must exceed the pools' depth (%d)" % POOL_DEPTH)

    vllm = load(on_gpu)
    from pinstage.integrations import vllm as plugin

    meta = _report.machine_meta()
    print(
        "vLLM 0.33 Model Runner V2 input preparation per step on %s (torch %s), %d KV-cache group(s), "
        "%d steps in flight per window" % (meta["gpu"] or meta["cpu"], meta["torch"], args.kv_groups, args.in_flight)
    )
    if not on_gpu:
        print(
            "No GPU: a CPU smoke pass (vLLM's kernels in Triton's interpreter, no pinned memory, nothing in "
            "flight, the plugin leaves the pools to vLLM): it checks values; its times mean nothing."
        )
    loop = Loop(vllm, plugin, args, on_gpu)
    loop.device = torch.device("cuda" if on_gpu else "cpu")
    max_reqs = max(sizes) + GUARD_ROWS
    rows = []
    calls = {}
    for batch in sizes:
        before = plugin.counters()
        rows.append(run_size(loop, batch, max_reqs))
        after = plugin.counters()
        calls[batch] = {k: {w: after[k][w] - before.get(k, {}).get(w, 0) for w in ("routed", "to_vllm")} for k in after}
        r = rows[-1]
        print(
            "  %4d requests: pinstage / vLLM %.2fx, wrong values vLLM %d, pinstage %d"
            % (batch, r["ratio"], r["modes"]["vllm"]["wrong_values"], r["modes"]["pinstage"]["wrong_values"]),
            file=sys.stderr,
            flush=True,
        )

    table = table_rows(rows)
    _report.print_table(table)
    print(
        "Host us per step: median [min-max] of %d rounds' means (each round: %d windows of %d steps per mode, "
        "modes alternating); pinstage / vLLM per round, median [min-max]." % (args.rounds, args.windows, args.in_flight)
    )
    checks = []
    for r in rows:
        v, p = r["modes"]["vllm"], r["modes"]["pinstage"]
        checks.append(
            _report.check(
                "%d requests: values the device read wrong with the plugin" % r["batch"],
                p["wrong_values"],
                "0",
                p["wrong_values"] == 0,
                "vLLM untouched: %d of %d wrong; %d of %d windows had every step in flight"
                % (v["wrong_values"], v["values_checked"], v["windows_in_flight"], v["windows"]),
            )
        )
        checks.append(
            _report.check(
                "%d requests: host per step, pinstage / vLLM" % r["batch"],
                r["ratio"],
                "<= 1.00",
                (r["ratio"] <= 1.0) if on_gpu else None,
                "" if on_gpu else "CPU smoke: times mean nothing",
            )
        )
    _report.print_checks(checks)
    os.makedirs(args.out, exist_ok=True)
    report = dict(
        meta=meta,
        vllm="0.33.0",
        device=str(loop.device),
        kv_groups=args.kv_groups,
        in_flight=args.in_flight,
        pool_depth=POOL_DEPTH,
        rounds=args.rounds,
        windows=args.windows,
        max_num_reqs=max_reqs,
        results=rows,
        calls_per_size=calls,
        checks=checks,
    )
    _report.write_json(os.path.join(args.out, "vllm_loop.json"), report)
    with open(os.path.join(args.out, "vllm_loop.md"), "w") as f:
        f.write(
            "# vLLM 0.33 runner input preparation (%s, torch %s, %s)\n\n"
            % (meta["gpu"] or "CPU smoke", meta["torch"], meta["date"])
        )
        f.write("Command: `%s`\n\n" % meta["command"])
        f.write(_report.markdown_table(table) + "\n")
        f.write(
            "\nHost us per step: median [min-max] of %d rounds' means (%d windows of %d steps per mode a round, "
            "modes alternating; the ratio per round). Wrong values: read by the device and not what the host "
            "wrote for that step. Windows all in flight (vLLM, pinstage): the device had not read the window's "
            "first step when the host had prepared its last.\n\n" % (args.rounds, args.windows, args.in_flight)
        )
        f.write(_report.markdown_checks(checks) + "\n")
    print("wrote %s" % os.path.join(args.out, "vllm_loop.md"))
    _report.plot_panels(
        os.path.join(args.out, "vllm_loop.png"),
        [
            (
                "host us per step",
                {
                    ("vLLM" if m == "vllm" else "pinstage plugin"): [
                        (r["batch"], r["modes"][m]["step_us"]) for r in rows
                    ]
                    for m in MODES
                },
            ),
            ("pinstage / vLLM", {"ratio": [(r["batch"], r["ratio"]) for r in rows]}),
        ],
        meta,
        xlabel="requests in the batch",
        ylabel="host us per step",
        title="vLLM 0.33 runner input preparation",
    )
    if any(c["ok"] is False and "wrong" in c["check"] for c in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
