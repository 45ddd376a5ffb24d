"""pinstage.builders is typed: mypy --strict passes on it, on the README's builders example and on
code that feeds it objects shaped like SGLang's; it flags the misuses that raise TypeError at run
time. And at run time, misuse raises a TypeError naming what was expected (not an AttributeError)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pinstage.builders import (
    BatchState, Request, SamplingParams, build_decode_inputs, build_penalty_last_token_ids, build_sampling_batch,
)

ROOT = Path(__file__).resolve().parent.parent

# Objects shaped like SGLang 0.5.23's (its Req keeps the row in a ReqKvInfo, output_ids an array("q")),
# used as the builders' protocols allow.
ENGINE_SHAPED = '''
from array import array
from typing import List, Optional

import torch
from pinstage.builders import BatchState, SamplingBatch, build_decode_inputs, build_sampling_batch


class ReqKvInfo:
    req_pool_idx: Optional[int] = None


class EngineSamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 1 << 30
    min_p: float = 0.0
    sampling_seed: Optional[int] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 16


class Req:
    def __init__(self, origin_input_ids: List[int]) -> None:
        self.origin_input_ids = origin_input_ids
        self.output_ids = array("q")
        self.kv = ReqKvInfo()
        self.sampling_params = EngineSamplingParams()


reqs = [Req([1, 2]), Req([3])]
ids: torch.Tensor = build_decode_inputs(reqs).input_ids
batch: SamplingBatch = build_sampling_batch([r.sampling_params for r in reqs])
state = BatchState()
slot: int = state.add(reqs[0])
'''

# Each line is a misuse mypy must report (the same ones raise TypeError at run time).
MISUSES = '''
from pinstage.builders import BatchState, Request, SamplingParams, build_decode_inputs, build_sampling_batch

requests = [Request([1])]
BatchState().add(SamplingParams())  # line 5
build_sampling_batch(requests)  # line 6
build_decode_inputs(requests[0])  # line 7
Request([1], sampling_params=None)  # line 8
'''

# pinstage's compiled-core stub and the modules outside pinstage.builders are not under test here.
MYPY_CONFIG = """[mypy]
strict = True
follow_imports = silent
[mypy-pinstage._C]
ignore_errors = True
"""


def readme_builders_example():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Builders"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_mypy_strict_passes_on_the_builders_and_flags_each_misuse(tmp_path):
    """One mypy --strict run (about 40 s cold, most of it reading torch; the cache under build/ keeps
    it) over pinstage.builders, the README example, ENGINE_SHAPED and MISUSES: no error but the four
    misuses, each reported."""
    pytest.importorskip("mypy")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    files = {"readme_example.py": readme_builders_example(), "engine_shaped.py": ENGINE_SHAPED, "misuses.py": MISUSES}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
         "--cache-dir", str(ROOT / "build" / "mypy_cache"), "pinstage/builders", *(str(tmp_path / f) for f in files)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [e for e in errors if "misuses.py" not in e] == [], result.stdout + result.stderr
    flagged = {int(m) for e in errors for m in re.findall(r"misuses\.py:(\d+): error", e)}
    assert flagged == {5, 6, 7, 8}, result.stdout + result.stderr


@pytest.mark.parametrize(
    "misuse, message",
    [
        (lambda: BatchState().add(SamplingParams()),
         r"^BatchState.add: expected a request with origin_input_ids, output_ids, sampling_params, "
         r"got SamplingParams without origin_input_ids$"),
        (lambda: BatchState().add(Request([1], sampling_params=None)),
         r"^BatchState.add: sampling_params: expected sampling parameters with temperature, .*, "
         r"got NoneType without temperature$"),
        (lambda: build_sampling_batch([Request([1])], device="cpu"),
         r"^build_sampling_batch: request 0: expected sampling parameters \(a request's .sampling_params\) "
         r"with temperature, .*, got Request without temperature$"),
        (lambda: build_sampling_batch([SamplingParams(), None], device="cpu"),
         r"^build_sampling_batch: request 1: expected sampling parameters .* got NoneType without temperature$"),
        (lambda: build_sampling_batch(SamplingParams(), device="cpu"),
         r"^build_sampling_batch: expected a list of sampling parameters, one per request, got SamplingParams$"),
        (lambda: build_decode_inputs(Request([1]), device="cpu"),
         r"^build_decode_inputs: expected a list of requests, one per request, got Request$"),
        (lambda: build_decode_inputs([Request([1]), SamplingParams()], device="cpu"),
         r"^build_decode_inputs: request 1: expected a request with origin_input_ids, output_ids, "
         r"got SamplingParams without origin_input_ids$"),
        (lambda: build_decode_inputs([type("NoRow", (), {"origin_input_ids": [1], "output_ids": []})()], device="cpu"),
         r"^build_decode_inputs: request 0: expected a request with req_pool_idx or kv.req_pool_idx, got NoRow$"),
        (lambda: build_penalty_last_token_ids("abc", device="cpu"),
         r"^build_penalty_last_token_ids: expected a list of requests, one per request, got str$"),
        (lambda: BatchState().merge([Request([1])]),
         r"^BatchState.merge: expected a BatchState, got list$"),
    ],
)
def test_misuse_raises_type_error_naming_what_was_expected(misuse, message):
    with pytest.raises(TypeError, match=message):
        misuse()
