"""The wording of the errors and help users see: each message names what the caller wrote."""

import inspect
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from support import ROOT

import pinstage
from pinstage.builders import Request, SamplingParams, build_decode_inputs, build_sampling_batch, stage_prefill


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


def test_configure_takes_an_int_of_at_least_one_page():
    """ring_bytes="16MB" and ring_bytes=100 were once taken without a word. A str is refused
    (naming the int it would mean: the environment variable takes "16M", configure an int), and a
    ring below one page too."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'ringbytes'"):
        pinstage.configure(ringbytes=1)
    before = pinstage.stats()["ring_bytes"] or 8 << 20
    try:
        pinstage.configure(ring_bytes=4096)
        pinstage.configure(ring_bytes=8 << 20)
        with pytest.raises(
            TypeError,
            match=r"ring_bytes must be an int \(bytes\), got str '16MB'; pass the int "
            r"16777216 \(.*PINSTAGE_RING_BYTES",
        ):
            pinstage.configure(ring_bytes="16MB")
        with pytest.raises(TypeError, match=r"ring_bytes must be an int \(bytes\), got str '16Q' \("):
            pinstage.configure(ring_bytes="16Q")
        with pytest.raises(TypeError, match=r"ring_bytes must be an int \(bytes\), got float"):
            pinstage.configure(ring_bytes=16e6)
        for small in (100, 4095):
            with pytest.raises(
                ValueError, match=r"ring_bytes must be at least 4096 bytes \(one page\), got %d$" % small
            ):
                pinstage.configure(ring_bytes=small)
        with pytest.raises(ValueError, match=r"on_full must be \"overflow\", \"wait\" or \"error\", got \"never\""):
            pinstage.configure(on_full="never")
    finally:
        pinstage.configure(ring_bytes=before)


@pytest.mark.parametrize("value, ok", [("16M", True), ("4K", True), ("100", False), ("2K", False)])
def test_ring_bytes_from_the_environment_is_at_least_one_page(value, ok):
    env = dict(os.environ, PINSTAGE_RING_BYTES=value, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", "import pinstage; pinstage.configure(on_full='overflow')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        assert "ValueError: pinstage: PINSTAGE_RING_BYTES must be at least 4096 bytes (one page)" in proc.stderr, (
            proc.stderr[-2000:]
        )


@pytest.mark.parametrize(
    "dtype, said",
    [
        (np.int64, r"got numpy.int64 \(a numpy type\); use torch.int64"),
        (np.float32, r"got numpy.float32 \(a numpy type\); use torch.float32"),
        (np.bool_, r"got numpy.bool \(a numpy type\); use torch.bool"),
        (np.dtype("uint16"), r"got numpy.dtype\('uint16'\) \(a numpy dtype\); use torch.uint16"),
        (np.str_, r"got numpy.str_ \(a numpy type\); it has no torch dtype"),
        (int, r"got the type int$"),
        ("int64", r"got str$"),
    ],
    ids=["np.int64", "np.float32", "np.bool_", "np.dtype", "np.str_", "int", "str"],
)
def test_a_dtype_that_is_not_a_torch_dtype_is_named_with_its_torch_counterpart(dtype, said):
    """np.int64 was "got type": now what it is and the torch dtype to use, for every entry point."""
    with pytest.raises(TypeError, match=r"pinstage: dtype must be a torch.dtype, " + said):
        pinstage.stage_to_device([1], dtype)
    with pytest.raises(TypeError, match=r"item 1: pinstage: dtype must be a torch.dtype, " + said):
        pinstage.stage_many([([1], torch.int64), ([1], dtype)])
    with pytest.raises(TypeError, match=r"pinstage: Field dtype must be a torch.dtype, " + said):
        pinstage.Field(dtype)  # at construction, not when a StaticInputs is built from it


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda items: pinstage.stage_many(items, device="cuda:63"), "pinstage.stage_many"),
        (lambda items: stage_prefill(items, [], [], device="cuda:63"), "pinstage.builders.stage_prefill"),
    ],
    ids=["stage_many", "stage_prefill"],
)
def test_items_that_are_no_sequence_are_named_before_the_device(call, name):
    """A device that does not exist (no GPU has 64 devices) would raise too: the items come first."""
    with pytest.raises(TypeError, match=rf"^{name}: items must be a sequence of \(data, dtype\) pairs, got int$"):
        call(5)


def test_ring_full_error_is_a_runtime_error_engines_can_catch():
    assert issubclass(pinstage.RingFullError, RuntimeError)
    assert pinstage.RingFullError.__module__ == "pinstage"


def test_public_functions_have_signatures_and_documentation():
    for name in pinstage.__all__:
        obj = getattr(pinstage, name)
        if inspect.isroutine(obj):  # the staging functions are compiled ones (builtins)
            inspect.signature(obj)
            assert obj.__doc__ and len(obj.__doc__) > 40, name
    assert "ring_bytes" in str(inspect.signature(pinstage.configure))
    assert str(inspect.signature(pinstage.stage_to_device)) == "(data, dtype, stream=None, *, device=None)"
    assert str(inspect.signature(pinstage.stage_many)) == "(items, stream=None, *, device=None)"
    assert str(inspect.signature(pinstage.stage_into)) == "(data, out, stream=None)"
    assert str(inspect.signature(pinstage._C._static_inputs_stage)) == "(inputs, values, n, stream)"
    assert "fetch_overflows" in pinstage.Stats.__annotations__


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: pinstage.stage_to_device([1]), r"stage_to_device\(\) missing required argument 'dtype'"),
        (
            lambda: pinstage.stage_to_device([1], torch.int64, None, "cpu"),
            r"at most 3 positional arguments \(4 given\)",
        ),
        (lambda: pinstage.stage_to_device([1], torch.int64, devic="cpu"), r"unexpected keyword argument 'devic'"),
        (
            lambda: pinstage.stage_to_device([1], torch.int64, dtype=torch.int64),
            r"multiple values for argument 'dtype'",
        ),
        (lambda: pinstage.stage_many(device="cpu"), r"stage_many\(\) missing required argument 'items'"),
        (lambda: pinstage.stage_into([1], out=None, stream=None, x=1), r"unexpected keyword argument 'x'"),
        # A keyword is its whole str: a NUL does not end it early, a lone surrogate is just unknown.
        (
            lambda: pinstage.stage_to_device([1], **{"dtype\0x": torch.int64}),
            r"unexpected keyword argument 'dtype\\x00x'",
        ),
        (lambda: pinstage.stage_to_device([1], torch.int64, **{"\udc80": 1}), r"unexpected keyword argument '\\udc80'"),
        (
            lambda: pinstage._C._static_inputs_stage(None, [], 0, None, None),
            r"_static_inputs_stage\(\) takes exactly 4 positional arguments \(5 given\)",
        ),
        (
            lambda: pinstage._C._static_inputs_stage(object(), [], 0, None),
            r"_static_inputs_stage: inputs must be a pinstage._C.StaticInputs, got object",
        ),
    ],
)
def test_staging_functions_check_their_arguments_as_python_does(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_staging_functions_take_every_argument_by_keyword():
    out = torch.zeros(2, dtype=torch.int32)
    assert pinstage.stage_to_device(data=[1, 2], dtype=torch.int32, stream=None, device="cpu").tolist() == [1, 2]
    assert pinstage.stage_many(items=[([3], torch.int64)], device="cpu")[0].tolist() == [3]
    assert pinstage.stage_into(data=[4, 5], out=out, stream=None) is out and out.tolist() == [4, 5]


def test_importing_an_unbuilt_checkout_says_how_to_build(tmp_path):
    package = tmp_path / "pinstage"
    shutil.copytree(
        os.path.dirname(pinstage.__file__), package, ignore=shutil.ignore_patterns("_C*.so", "_C*.pyd", "__pycache__")
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import pinstage"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        timeout=120,
    )
    assert proc.returncode != 0
    assert "compiled extension (pinstage._C) is not built" in proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr
    assert "circular import" not in proc.stderr
