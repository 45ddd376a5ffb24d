"""pinstage.integrations.sglang on SGLang 0.5.23's real scheduler code.

Each scenario runs twice on the same inputs, once as SGLang ships and once with enable(), from a
fresh scheduler world (request table, KV allocator, radix cache): admission with prefix-cache hits,
chunked prefill, input logprobs from random starts (some at the extend length), penalties on and
off, seeds, batches of 1-300 requests, decode steps, finished requests filtered out and new
prefills merged in. Every output SGLang keeps (batch tensors and lists, the request table, the
sampling info with its flags and penalizer state, the logits processor's indices) must be equal in
value, dtype, shape and device.
"""

import dataclasses
import functools
import random
import subprocess
import sys

import pytest
import torch

import pinstage
from bench.engines.sglang_snapshot import plain, plain_fields, snapshot
from bench.engines.sglang_stubs import PREFIXES, VERSION
from bench.engines.source import REPO, engine_root
from pinstage.integrations import sglang as pinstage_sglang

# SGLang 0.5.23 picks its Triton kernels by platform, not by tensor: where CUDA is available it
# launches them on CPU tensors too, so its CPU path runs where no GPU is visible (no_gpu).
DEVICES = [pytest.param("cpu", marks=pytest.mark.no_gpu), pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(scope="module")
def sg():
    from bench.engines import sglang_stubs

    root = engine_root("sglang", VERSION, PREFIXES)
    missing = [p for p in PREFIXES if not (root / p).exists()]
    if missing:
        pytest.fail(
            f"{root} lacks {missing} (unpacked for fewer files than these tests import): delete it, "
            "and the next run unpacks the wheel again"
        )
    return sglang_stubs.import_sglang(root)


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    pinstage_sglang.disable()


# ------------------------------------------------------------------------------------ snapshots


def pruned_indices(sg, batch, hidden):
    """The logits processor's sample and input-logprob indices for a prefill with input logprobs."""
    from bench.engines import sglang_stubs

    metadata = sglang_stubs.logits_metadata(sg, batch)
    states = hidden[: sum(batch.extend_lens)]
    result = sg.LogitsProcessor._get_pruned_states(None, states, None, None, metadata)
    return [plain(x) for x in result] + [plain_fields(metadata, ["sample_indices_cpu", "input_logprob_indices_cpu"])]


# ------------------------------------------------------------------------------------ scenarios


def random_params(rng, penalties, seeds):
    params = {
        "temperature": rng.choice([0.0, 0.5, 0.7, 1.0, 1.3]),
        "top_p": rng.choice([1.0, 0.9, 0.5]),
        "top_k": rng.choice([-1, -1, 1, 20, 50]),
        "min_p": rng.choice([0.0, 0.0, 0.05]),
        "max_new_tokens": 64,
    }
    if penalties:
        params.update(
            frequency_penalty=rng.choice([0.0, 0.5]),
            presence_penalty=rng.choice([0.0, -0.3]),
            repetition_penalty=rng.choice([1.0, 1.2]),
            min_new_tokens=rng.choice([0, 0, 3]),
        )
    if seeds:
        params["sampling_seed"] = rng.choice([None, rng.randrange(1 << 40)])
    return params


def run_scenario(sg, device, seed, max_bs, penalties, seeds, rounds=3, decode_steps=2):
    """One scheduler run; returns every recorded output, in order, and how often each scheduler case
    came up (prefix hits, chunks, input logprobs starting at the extend length, merges)."""
    from bench.engines import sglang_stubs

    rng = random.Random(seed)
    world = sglang_stubs.SchedulerWorld(sg, device)
    vocab = world.vocab_size
    cached = [[rng.randrange(vocab) for _ in range(rng.randint(8, 40))] for _ in range(6)]
    for prompt in cached:
        world.cache_prompt(prompt)
    hidden = torch.arange(40_000, dtype=torch.float32, device=device).view(-1, 1)
    log, running, chunked = [], None, []
    seen = dict.fromkeys(["prefix hit", "chunk", "logprob start at extend length", "merge"], 0)

    def sample(reqs):
        for r in reqs:
            r.output_ids.append(rng.randrange(vocab))

    for _ in range(rounds):
        reqs = list(chunked)  # a chunked request's next chunk comes first, as in SGLang
        for r in chunked:
            r.prefix_len = r.extend_end  # its row already holds the chunks done
            world.extend_to(r, rng.choice([None, 16]))
        for _ in range(rng.randint(1, max_bs)):
            base = rng.choice(cached)[: rng.randint(1, 40)] if rng.random() < 0.5 else []  # a prefix hit
            prompt = base + [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
            logprob = rng.random() < 0.3
            req = world.request(
                prompt,
                random_params(rng, penalties, seeds),
                return_logprob=logprob,
                logprob_start_len=rng.choice([-1, 0, rng.randrange(len(prompt))]),
            )
            world.admit(req, chunk=rng.choice([None, None, None, 8]))
            reqs.append(req)
        batch = world.prefill_batch(reqs)
        log.append(("prefill", snapshot(batch)))
        seen["prefix hit"] += sum(r.prefix_len > 0 and r not in chunked for r in reqs)
        seen["logprob start at extend length"] += sum(
            r.return_logprob and start == n
            for r, start, n in zip(reqs, batch.extend_logprob_start_lens, batch.extend_lens)
        )
        if batch.return_logprob:
            log.append(("pruned", pruned_indices(sg, batch, hidden)))

        chunked = [r for r in reqs if r.extend_end < len(r.full_untruncated_fill_ids)]
        seen["chunk"] += len(chunked)
        done = [r for r in reqs if r not in chunked]
        sample(done)
        if chunked:
            batch.filter_batch(keep_indices=[i for i, r in enumerate(reqs) if r in done])
            log.append(("filter chunked", snapshot(batch)))
        if not done:
            continue
        if running is None:
            running = batch
        else:
            running.merge_batch(batch)
            seen["merge"] += 1
            log.append(("merge", snapshot(running)))
        for _ in range(decode_steps):
            running.prepare_for_decode()
            log.append(("decode", snapshot(running)))
            sample(running.reqs)
        keep = sorted(rng.sample(range(len(running.reqs)), rng.randint(1, len(running.reqs))))
        running.filter_batch(keep_indices=keep)
        log.append(("filter", snapshot(running)))
    return log, seen


SCENARIOS = [  # seed, max batch size, penalties, seeds
    (1, 1, False, False),
    (2, 8, True, False),
    (3, 40, True, True),
    (4, 120, False, True),
    (5, 300, True, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed, max_bs, penalties, seeds", SCENARIOS)
def test_outputs_identical_with_pinstage(sg, device, seed, max_bs, penalties, seeds):
    calls = pinstage.stats(device)["calls"]
    expected, seen = run_scenario(sg, device, seed, max_bs, penalties, seeds)
    assert pinstage.stats(device)["calls"] == calls, "SGLang as shipped must not reach pinstage"
    with pinstage_sglang.enabled():
        actual, _ = run_scenario(sg, device, seed, max_bs, penalties, seeds)
    assert pinstage.stats(device)["calls"] > calls, "the enabled run never reached pinstage"
    if max_bs >= 40:
        assert all(seen.values()), seen
    assert [step for step, _ in actual] == [step for step, _ in expected]
    for i, ((step, got), (_, want)) in enumerate(zip(actual, expected)):
        assert got == want, f"step {i} ({step}) differs"


@pytest.mark.parametrize("device", DEVICES)
def test_from_schedule_batch_with_rare_features_is_sglangs(sg, device):
    """A batch with logit bias or a sampling mask goes to SGLang's method (its row indices through
    pinstage's helper); an all-default batch gets SGLang's exact flags from pinstage's code."""
    from bench.engines import sglang_stubs

    def build(params):
        world = sglang_stubs.SchedulerWorld(sg, device)
        reqs = []
        for i, p in enumerate(params):
            mask = p.pop("mask", False)
            req = world.request([5 + i, 6, 7], p)
            req.return_sampling_mask = mask
            world.admit(req)
            reqs.append(req)
        return snapshot(world.prefill_batch(reqs))

    cases = [
        [{"logit_bias": {"3": 1.5, "7": -2.0}}, {}],
        [{"mask": True, "top_k": 5}, {}],
        [{}, {"temperature": 0.0}],
        [{"top_k": 1}, {"top_k": 1}],
        [{"top_k": 2000}, {"min_p": 0.1, "top_p": 0.5}],
    ]
    for params in cases:
        expected = build([dict(p) for p in params])
        with pinstage_sglang.enabled():
            assert build([dict(p) for p in params]) == expected, params


# ------------------------------------------------------------------------------------ the patch


def test_enable_disable_restores_every_original(sg):
    owners = [
        (sg.ScheduleBatch, "prepare_for_extend"),
        (sg.ScheduleBatch, "filter_batch"),
        (sg.ScheduleBatch, "cumulate_penalty_output_tokens"),
        (sg.LogitsProcessor, "_get_pruned_states"),
        (sg.SamplingBatchInfo, "from_schedule_batch"),
        (sg.sampling_batch_info, "_rows_to_device_indices"),
        (sg.allocation, "write_cache_indices"),
    ]
    originals = [owner.__dict__[name] for owner, name in owners]
    pinstage_sglang.enable()
    patched = [owner.__dict__[name] for owner, name in owners]
    assert all(p is not o for p, o in zip(patched, originals))
    pinstage_sglang.enable()  # a second call changes nothing
    assert [owner.__dict__[name] for owner, name in owners] == patched
    pinstage_sglang.disable()
    assert all(owner.__dict__[name] is o for (owner, name), o in zip(owners, originals))
    pinstage_sglang.disable()
    with pinstage_sglang.enabled():
        assert pinstage_sglang.is_enabled()
    assert all(owner.__dict__[name] is o for (owner, name), o in zip(owners, originals))


@pytest.mark.parametrize("exit_by", ["disable", "enabled_block"])
def test_disable_leaves_a_wrapper_installed_after_enable(sg, exit_by):
    """Another library wraps a patched function while pinstage is enabled: disable() (or the end of
    enabled()) puts back the other functions and leaves that wrapper in place."""
    owners = [(sg.ScheduleBatch, "filter_batch"), (sg.allocation, "write_cache_indices")]
    originals = [owner.__dict__[name] for owner, name in owners]
    theirs = []

    def wrap(owner, name):
        inner = owner.__dict__[name]
        wrapper = functools.wraps(inner)(lambda *args, **kwargs: inner(*args, **kwargs))
        setattr(owner, name, wrapper)
        theirs.append(wrapper)

    try:
        if exit_by == "disable":
            pinstage_sglang.enable()
            wrap(*owners[0])
            pinstage_sglang.disable()
        else:
            with pinstage_sglang.enabled():
                wrap(*owners[0])
        assert sg.ScheduleBatch.__dict__["filter_batch"] is theirs[0]
        assert sg.allocation.__dict__["write_cache_indices"] is originals[1]
        assert not pinstage_sglang.is_enabled()
    finally:
        sg.ScheduleBatch.filter_batch = originals[0]


def test_enable_refuses_an_untested_version(sg, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.22")
    with pytest.raises(RuntimeError, match=r"tested with SGLang 0\.5\.23 only; SGLang is version 0\.5\.22"):
        pinstage_sglang.enable()
    assert not pinstage_sglang.is_enabled()
    assert sg.ScheduleBatch.__dict__["filter_batch"].__module__ == "sglang.srt.managers.schedule_batch"


def test_a_changed_source_is_refused(sg):
    from pinstage.integrations._sglang_sites import with_staged_copies

    with pytest.raises(RuntimeError, match="2 were expected: this is not the source"):
        with_staged_copies(sg.ScheduleBatch.__dict__["filter_batch"], 2)


def test_rewritten_function_reports_sglangs_file_and_lines(sg):
    from pinstage.integrations._sglang_sites import with_staged_copies

    original = sg.ScheduleBatch.__dict__["filter_batch"]
    rewritten = with_staged_copies(original, 1)
    assert rewritten.__code__.co_filename == original.__code__.co_filename
    assert rewritten.__code__.co_firstlineno == original.__code__.co_firstlineno
    assert rewritten.__wrapped__ is original


def test_importing_pinstage_does_not_import_sglang():
    code = (
        "import sys, pinstage, pinstage.builders, pinstage.integrations.sglang; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("device", DEVICES)
def test_patched_functions_do_not_wait_for_the_gpu(sg, device):
    """Each replaced function gives SGLang's results; on CUDA, called with a long kernel queued on
    the current stream, it runs under torch's sync-debug "error" mode and returns while that kernel
    still runs."""
    from support import run_while_stream_busy

    from bench.engines import sglang_stubs

    def prefilled():
        rng = random.Random(7)
        world = sglang_stubs.SchedulerWorld(sg, device)
        reqs = []
        for _ in range(64):
            req = world.request(
                [rng.randrange(1000) for _ in range(rng.randint(2, 30))],
                random_params(rng, penalties=True, seeds=False),
                return_logprob=True,
                logprob_start_len=0,
            )
            world.admit(req)
            reqs.append(req)
        batch = world.prefill_batch(reqs)
        for r in batch.reqs:
            r.output_ids.append(rng.randrange(1000))
        return world, batch

    def steps(world, batch):
        hidden = torch.ones(sum(batch.extend_lens), 1, device=device)
        metadata = sglang_stubs.logits_metadata(sg, batch)
        out_cache_loc = world.allocator.alloc(3)
        rows = torch.tensor([1, 2, 3])
        lens = [torch.tensor(v) for v in ([0, 2, 0], [1, 3, 1], [1, 1, 1])]  # prefix, seq, extend
        # Made here, not in the timed call: a copy from pageable memory is the test's own wait.
        rows_d, lens_d = rows.to(device), [t.to(device) for t in lens]
        prefix = [sg.allocation._EMPTY_PREFIX, world.allocator.alloc(2), sg.allocation._EMPTY_PREFIX]
        frequency = batch.sampling_info.penalizer_orchestrator.penalizers[
            sg.sampling_batch_info.penaltylib.BatchedFrequencyPenalizer
        ]
        return {  # each returns what it made; read only after the GPU is done
            "from_schedule_batch": lambda: sg.SamplingBatchInfo.from_schedule_batch(batch, world.vocab_size),
            "cumulate_penalty_output_tokens": lambda: batch.cumulate_penalty_output_tokens() or frequency,
            "pruned states": lambda: sg.LogitsProcessor._get_pruned_states(None, hidden, None, None, metadata)[3:5],
            "write_cache_indices": lambda: (
                sg.allocation.write_cache_indices(
                    out_cache_loc,
                    rows_d,
                    rows,
                    lens_d[0],
                    lens[0],
                    lens_d[1],
                    lens[1],
                    lens_d[2],
                    lens[2],
                    prefix,
                    world.pool,
                )
                or world.pool.req_to_token[1:4]
            ),
            "filter_batch": lambda: batch.filter_batch(keep_indices=[0, 5, 9]) or batch,
        }

    def as_data(made):
        if isinstance(made, sg.ScheduleBatch):
            return snapshot(made)
        if isinstance(made, sg.SamplingBatchInfo):
            return plain_fields(made, [f.name for f in dataclasses.fields(made)])
        if isinstance(made, (tuple, torch.Tensor)):
            return plain(made)
        return plain_fields(made, sorted(vars(made)))

    world, batch = prefilled()
    expected = {name: as_data(step()) for name, step in steps(world, batch).items()}
    world, batch = prefilled()
    with pinstage_sglang.enabled():
        for name, step in steps(world, batch).items():
            if device == "cuda":
                result, still_running = run_while_stream_busy(step, torch.cuda.current_stream())
                assert still_running, f"{name} waited for the GPU"
            else:
                result = step()
            assert as_data(result) == expected[name], name


@pytest.mark.parametrize("device", DEVICES)
def test_write_cache_indices_leaves_other_prefix_dtypes_to_sglang(sg, device, monkeypatch):
    """Requests without a cached prefix share SGLang's empty CPU tensor (accepted: never read); a
    prefix tensor of another dtype than int64 is refused by pinstage's op before anything is
    written, and SGLang's own function then fills the table: the same rows either way."""
    from bench.engines import sglang_stubs
    from pinstage.integrations import _sglang_cache

    wrote = []  # per patched call: whether pinstage's op wrote the rows (False: it refused them)
    builder = _sglang_cache.pinstage_write_cache_indices

    def counted(*args, **kwargs):
        try:
            builder(*args, **kwargs)
        except TypeError:
            wrote.append(False)
            raise
        wrote.append(True)

    monkeypatch.setattr(_sglang_cache, "pinstage_write_cache_indices", counted)

    def run(prefix_dtype):
        world = sglang_stubs.SchedulerWorld(sg, device)
        out_cache_loc = world.allocator.alloc(3)
        rows = torch.tensor([1, 2, 3])
        lens = [torch.tensor(v) for v in ([0, 2, 0], [1, 3, 1], [1, 1, 1])]  # prefix, seq, extend
        prefix = [sg.allocation._EMPTY_PREFIX, world.allocator.alloc(2).to(prefix_dtype), sg.allocation._EMPTY_PREFIX]
        world.pool.req_to_token.zero_()
        sg.allocation.write_cache_indices(
            out_cache_loc,
            rows.to(device),
            rows,
            lens[0].to(device),
            lens[0],
            lens[1].to(device),
            lens[1],
            lens[2].to(device),
            lens[2],
            prefix,
            world.pool,
        )
        return world.pool.req_to_token[1:4].cpu()

    for dtype, by_pinstage in ((torch.int64, True), (torch.int32, False)):
        expected = run(dtype)
        wrote.clear()
        with pinstage_sglang.enabled():
            assert torch.equal(run(dtype), expected), dtype
        assert wrote == [by_pinstage], dtype


@pytest.mark.parametrize("device", DEVICES)
def test_write_cache_indices_is_pinstages_at_every_batch_size(sg, device):
    """pinstage's op writes the table for small and large batches alike (it no longer hands large
    ones to SGLang's Triton kernel): the rows equal the out_cache_loc slots, and SGLang's own
    function is never called."""
    from bench.engines import sglang_stubs
    from pinstage.integrations import _sglang_cache

    world = sglang_stubs.SchedulerWorld(sg, device)
    table_write = type(world.pool).write
    for batch in (1, 3, 300):  # 300: past the 256 from which pinstage used to hand batches to SGLang
        called = []
        write = _sglang_cache.make_write_cache_indices(lambda *a: called.append(a), table_write)
        out_cache_loc = world.allocator.alloc(2 * batch)
        rows = torch.arange(1, batch + 1)
        prefix_lens, extend_lens = torch.zeros(batch, dtype=torch.int64), torch.full((batch,), 2)
        args = [out_cache_loc, rows.to(device), rows, prefix_lens.to(device), prefix_lens]
        args += [extend_lens.to(device), extend_lens, extend_lens.to(device), extend_lens]
        world.pool.req_to_token.zero_()
        write(*args, [sg.allocation._EMPTY_PREFIX] * batch, world.pool)
        assert not called, batch
        got = world.pool.req_to_token[1 : batch + 1, :2].cpu()
        assert torch.equal(got, out_cache_loc.view(batch, 2).to(got.dtype).cpu()), batch
