"""bench/vllm_loop.py on vLLM 0.33's own runner objects (states, block tables, sampling states, with
their Triton kernels: on the GPU, or in Triton's interpreter on the CPU): every value the device
reads is checked, and through the plugin none is wrong."""

import json
import os
from importlib import metadata

import pytest
from support import DEVICES, ROOT, run_child

from bench.engines import vllm_stubs
from bench.engines.source import engine_root

CHILD = """
import sys
sys.path.insert(0, {bench!r})
import vllm_loop

vllm_loop.main({args!r})
"""

# What an older Triton's interpreter raises for vLLM's tl.range under numpy >= 2.4 (Triton 3.8's runs it).
_INTERPRETER_LIMIT = "only 0-dimensional arrays can be converted to Python scalars"


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_loop_reads_back_every_value(device, tmp_path, monkeypatch):
    engine_root("vllm", vllm_stubs.VLLM_VERSION, vllm_stubs.VLLM_FILES)  # skips where vLLM's source is not here
    if device == "cpu":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the loop runs where CUDA is: hide it for the CPU case
    args = ["--out", str(tmp_path), "--sizes", "8", "--rounds", "2", "--windows", "1", "--warmup", "1"]
    try:
        run_child(CHILD.format(bench=os.path.join(ROOT, "bench"), args=args), timeout=600)
    except AssertionError as exc:
        if device == "cpu" and _INTERPRETER_LIMIT in str(exc):
            pytest.skip(
                "Triton %s's interpreter cannot run vLLM's kernels with numpy %s (it takes int() of a "
                "1-element array for a loop bound, which this numpy refuses); the cuda case runs them "
                "compiled" % (metadata.version("triton"), metadata.version("numpy"))
            )
        raise
    with open(tmp_path / "vllm_loop.json") as f:
        (row,) = json.load(f)["results"]
    modes = row["modes"]
    assert modes["vllm"]["values_checked"] == modes["pinstage"]["values_checked"] > 0  # the same steps
    assert modes["pinstage"]["wrong_values"] == 0, modes["pinstage"]["wrong_by_field"]
    if device == "cpu":
        assert modes["vllm"]["wrong_values"] == 0  # nothing in flight on the CPU: vLLM's values are right
    assert (tmp_path / "vllm_loop.md").exists()
