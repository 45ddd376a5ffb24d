"""Every ```python block of the README and of docs/ runs as written, each in a fresh interpreter outside
the checkout; where a ```text block follows it, that is exactly what it prints.

The fence's info string says what a block needs: `python` a CPU (it runs with CUDA hidden, so that its
printed output is the CPU's on any machine), `python gpu` a CUDA device (marked cuda), `python sglang`
or `python vllm` that engine installed (skipped where it is not)."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import support

ROOT = pathlib.Path(support.ROOT)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
NEEDS = {"": None, "gpu": "cuda", "sglang": "sglang", "vllm": "vllm"}


def python_blocks(path):
    """(line, need, code, printed or None) for each python block of a markdown file, in order."""
    text = path.read_text()
    fences = [(text.count("\n", 0, m.start()) + 1, m.group(1).split(), m.group(2)) for m in FENCE.finditer(text)]
    blocks = []
    for i, (line, info, body) in enumerate(fences):
        if info[:1] != ["python"]:
            continue
        need = " ".join(info[1:])
        assert need in NEEDS, "%s:%d: unknown python fence tag %r (known: %s)" % (path.name, line, need, sorted(NEEDS))
        following = fences[i + 1] if i + 1 < len(fences) else None
        printed = following[2] if following and following[1] == ["text"] else None
        blocks.append((line, need, body, printed))
    return blocks


def _params():
    params = []
    for path in DOCUMENTS:
        for line, need, code, printed in python_blocks(path):
            marks = [pytest.mark.cuda] if need == "gpu" else []
            params.append(pytest.param(code, need, printed, id="%s:%d" % (path.name, line), marks=marks))
    return params


@pytest.mark.parametrize("code, need, printed", _params())
def test_python_block_runs_as_written(code, need, printed, tmp_path):
    if need in ("sglang", "vllm") and importlib.util.find_spec(need) is None:
        pytest.skip("needs %s installed" % need)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if not need:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU block prints the CPU's output, GPU or not
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    if printed is not None and need in ("", "gpu"):
        assert proc.stdout.rstrip().splitlines() == printed.rstrip().splitlines(), proc.stdout


def test_the_readme_has_cpu_and_gpu_blocks_and_the_tags_are_known():
    """The fences parse as intended: the README's examples run on a CPU and its outputs are checked."""
    readme = python_blocks(ROOT / "README.md")
    assert sum(1 for _, need, _, printed in readme if not need and printed) >= 3
    every = [b for path in DOCUMENTS for b in python_blocks(path)]
    assert any(need == "gpu" for _, need, _, _ in every)
