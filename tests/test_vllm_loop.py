"""bench/vllm_loop.py on vLLM 0.33's own runner objects (states, block tables, sampling states, with
their Triton kernels: on the GPU, or in Triton's interpreter on the CPU): every value the device
reads is checked, and through the plugin none is wrong."""

import json
import os
import subprocess
import sys

import torch
from support import ROOT

from bench.engines import vllm_stubs
from bench.engines.source import engine_root


def test_vllm_loop_reads_back_every_value(tmp_path):
    engine_root("vllm", vllm_stubs.VLLM_VERSION, vllm_stubs.VLLM_FILES)  # skips where vLLM's source is not here
    cmd = [sys.executable, os.path.join(ROOT, "bench", "vllm_loop.py"), "--out", str(tmp_path), "--sizes", "8"]
    cmd += ["--rounds", "2", "--windows", "1", "--warmup", "1"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, "exit %d\n%s\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    with open(tmp_path / "vllm_loop.json") as f:
        (row,) = json.load(f)["results"]
    modes = row["modes"]
    assert modes["vllm"]["values_checked"] == modes["pinstage"]["values_checked"] > 0  # the same steps
    assert modes["pinstage"]["wrong_values"] == 0, modes["pinstage"]["wrong_by_field"]
    if not torch.cuda.is_available():
        assert modes["vllm"]["wrong_values"] == 0  # nothing in flight on the CPU: vLLM's values are right
    assert (tmp_path / "vllm_loop.md").exists()
