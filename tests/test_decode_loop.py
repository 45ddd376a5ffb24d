"""The decode-loop benchmark's own correctness: every backend, and the ideals' replays, drive the same
continuous batch to the same tokens (the benchmark asserts it; this runs it small)."""
import os
import sys

import pytest
import torch
from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import decode_loop  # noqa: E402


@pytest.fixture
def one_thread():
    """The model's tensors are tiny: torch's intra-op threads only contend with the other test
    workers (ten times slower on a loaded two-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_every_backend_generates_the_same_tokens(device, one_thread):
    """One round of every backend (the rounds' rotation is checked below). A short context keeps
    max_new_tokens small: in 12 steps about half the requests finish and others join."""
    cfg = decode_loop.Config(batch_size=5, forward_ms=0.2, steps=12, warmup_steps=1, admit_every=2, vocab=256,
                             d_model=32, n_heads=2, max_ctx=68)
    dev = torch.device(device)
    cycles = decode_loop.sleep_cycles_per_us() if device == "cuda" else 0.0
    results = decode_loop.run_config(cfg, dev, cycles, repeats=1)  # raises if two backends' tokens differ
    assert set(results) == set(decode_loop.BACKENDS)
    for name, summary in results.items():
        assert [m["steps"] for m in summary["runs"]] == [cfg.steps], (name, summary)
        assert summary["tokens_per_s"] > 0 and summary["of_ideal"] > 0
        if name not in decode_loop.UNSAFE or device == "cpu":  # the unsafe baselines may race on the GPU only
            assert summary["requests_with_other_tokens"] == 0, name


def test_rounds_rotate_the_order():
    names = list("abcdef")
    orders = [decode_loop.rotated(names, i, 3) for i in range(3)]
    assert all(sorted(o) == names for o in orders)
    assert len({o[0] for o in orders}) == 3  # a different backend starts each round


def test_workload_mixes_what_the_builders_must_handle():
    cfg = decode_loop.Config(batch_size=8, forward_ms=0.2)
    specs = decode_loop.make_workload(cfg, 200)
    assert {s.use_prefix for s in specs} == {True, False}
    assert any(s.logprob_start < len(s.prompt) for s in specs) and any(s.logprob_start == len(s.prompt) for s in specs)
    assert any(s.params.top_k == 1 for s in specs) and any(s.params.top_k > 1 for s in specs)
    assert any(s.params.repetition_penalty != 1 for s in specs)
    assert len({s.max_new_tokens for s in specs}) > 20
    assert all(cfg.prefix_len + len(s.prompt) + s.max_new_tokens < cfg.max_ctx for s in specs)
