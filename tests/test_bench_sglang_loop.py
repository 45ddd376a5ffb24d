"""bench/sglang_loop.py on SGLang 0.5.23's real scheduler code: a --quick run compares every step of
both variants and writes its JSON, table and plot; a difference in what pinstage hands the forward
stops the run. The bench runs in a child: SGLang picks its kernels by platform, so its CPU path runs
only where no GPU is visible (the child hides it)."""

import importlib.util
import json
import os

import pytest
from support import DEVICES, ROOT, run_child

from bench.engines.sglang_stubs import PREFIXES, VERSION
from bench.engines.source import engine_root

CHILD = """
import sys
sys.path.insert(0, {bench!r})
import pinstage
import sglang_loop

sglang_loop.main({args!r})

# The sampling tensors pinstage stages for SGLang, changed: the run must stop at the comparison.
stage_many = pinstage.stage_many
pinstage.stage_many = lambda items, **kw: [t + 1 if i == 0 else t for i, t in enumerate(stage_many(items, **kw))]
try:
    sglang_loop.main({changed!r})
except AssertionError as exc:
    print("STOPPED:", exc)
else:
    raise SystemExit("a changed sampling tensor went unnoticed")
"""


@pytest.mark.parametrize("device", DEVICES)
def test_quick_run_compares_every_step_and_writes_its_results(device, tmp_path, monkeypatch):
    engine_root("sglang", VERSION, PREFIXES)  # skips (conftest) where SGLang's source is not here
    common = ["--quick", "--device", device]
    args = common + ["--batch-sizes", "1,8", "--out", str(tmp_path)]
    changed = common + ["--batch-sizes", "8", "--repeats", "1", "--out", str(tmp_path / "changed")]
    if device == "cpu":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = run_child(CHILD.format(bench=os.path.join(ROOT, "bench"), args=args, changed=changed), timeout=300)
    assert "STOPPED: step -1: with pinstage the batch differs from SGLang's in ['sampling_info']" in out, out[-2000:]

    with open(tmp_path / "sglang_loop.json") as f:
        report = json.load(f)
    settings = report["settings"]
    assert (settings["steps"], settings["admit_every"], settings["repeats"], settings["device"]) == (20, 5, 2, device)
    assert [r["batch_size"] for r in report["results"]] == [1, 8]
    for row in report["results"]:
        assert row["steps_compared"] == 21  # the first prefill and the 20 timed steps
        for variant, rounds in row["rounds"].items():
            assert len(rounds) == 2, variant
            for r in rounds:
                assert (r["decode_steps"], r["admit_steps"]) == (17, 3), (variant, r)
                assert r["tokens"] >= 17 and r["tokens_per_s"] > 0 and r["decode_host_us"] > 0, (variant, r)
                assert r["final_batch_size"] >= 1
                assert (r["pinstage_calls"] > 0) == (variant == "pinstage"), (variant, r)
        # the same work in both variants: the same tokens
        assert len({r["tokens"] for rounds in row["rounds"].values() for r in rounds}) == 1
        assert row["summary"]["decode_host_us"]["ratio"] > 0
    assert report["checks"][0]["measured"] == 42  # the steps compared, summed over the configurations
    table = (tmp_path / "sglang_loop.md").read_text()
    assert "| 8 |" in table and "Replaced by the fixed forward" in table
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "sglang_loop.png").stat().st_size > 0
