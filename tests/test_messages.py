"""The wording of the errors and help users see: each message names what the caller wrote."""
import inspect
import os
import shutil
import subprocess
import sys

import pytest
import torch

import pinstage
from pinstage.builders import Request, SamplingParams, build_decode_inputs, build_sampling_batch


def test_a_bad_seed_names_the_request_and_the_field():
    params = [SamplingParams(), SamplingParams()]
    params[1].sampling_seed = "x"
    with pytest.raises(TypeError, match=r"request 1: sampling_seed must be an int, got str 'x'"):
        build_sampling_batch(params, enable_deterministic_sampling=True, device="cpu")


def test_a_bad_token_id_names_the_request_and_the_field():
    requests = [Request([1, 2]), Request([3], ["t"])]
    with pytest.raises(TypeError, match=r"request 1: last token id = 't' cannot be converted to torch.int64"):
        build_decode_inputs(requests, device="cpu")


def test_a_bad_top_level_value_is_called_data():
    with pytest.raises(TypeError) as info:
        pinstage.stage_to_device(None, torch.int64, device="cpu")
    assert "data = None cannot be converted to torch.int64" in str(info.value)
    assert "element  =" not in str(info.value)


@pytest.mark.parametrize("bad", [2.5, True])
def test_top_k_must_be_an_int(bad):
    with pytest.raises(TypeError, match=r"SamplingParams: top_k must be an int, got"):
        SamplingParams(top_k=bad)
    params = SamplingParams()
    params.top_k = bad
    with pytest.raises(TypeError, match=r"request 0: top_k must be an int"):
        build_sampling_batch([params], device="cpu")


def test_sampling_params_check_types_at_construction():
    with pytest.raises(TypeError, match=r"SamplingParams: temperature must be a real number, got str '0.7'"):
        SamplingParams(temperature="0.7")
    with pytest.raises(ValueError, match=r"SamplingParams: top_p must be in \(0, 1\], got 1.5"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match=r"SamplingParams: repetition_penalty must be in \(0, 2\], got 0"):
        SamplingParams(repetition_penalty=0)


def test_configure_takes_the_forms_the_environment_takes():
    with pytest.raises(TypeError, match="unexpected keyword argument 'ringbytes'"):
        pinstage.configure(ringbytes=1)
    pinstage.configure(ring_bytes="16M")
    pinstage.configure(ring_bytes=8 << 20)
    with pytest.raises(ValueError, match=r"ring_bytes must be a positive byte count such as 8388608, \"8M\""):
        pinstage.configure(ring_bytes="16Q")
    with pytest.raises(ValueError, match=r"on_full must be \"overflow\", \"wait\" or \"error\", got \"never\""):
        pinstage.configure(on_full="never")


def test_ring_full_error_is_a_runtime_error_engines_can_catch():
    assert issubclass(pinstage.RingFullError, RuntimeError)
    assert pinstage.RingFullError.__module__ == "pinstage"


def test_public_functions_have_signatures_and_documentation():
    for name in pinstage.__all__:
        obj = getattr(pinstage, name)
        if inspect.isfunction(obj):
            inspect.signature(obj)
            assert obj.__doc__ and len(obj.__doc__) > 40, name
    assert "ring_bytes" in str(inspect.signature(pinstage.configure))
    assert "fetch_overflows" in pinstage.stats.__doc__


def test_importing_an_unbuilt_checkout_says_how_to_build(tmp_path):
    package = tmp_path / "pinstage"
    shutil.copytree(os.path.dirname(pinstage.__file__), package,
                    ignore=shutil.ignore_patterns("_C*.so", "_C*.pyd", "__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "import pinstage"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=120)
    assert proc.returncode != 0
    assert "compiled extension (pinstage._C) is not built" in proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr
    assert "circular import" not in proc.stderr
