"""pinstage.integrations.vllm on vLLM 0.33's own modules (the wheel's source, heavy imports stood in).

Every output is compared with what vLLM's original gives for the same input (values, dtype, shape,
device); on CUDA, with more steps in flight than the UVA pool's depth behind a busy kernel, the
originals serve wrong values (reproduced here) and the plugin none.
"""

import functools
import importlib
import logging
import pathlib
import sys
import textwrap
import tomllib
import types
import warnings

import numpy as np
import pytest
import staging_reference
import torch
from staging_reference import assert_same_tensor
from support import DEVICES, run_child, run_while_stream_busy

import pinstage
from pinstage.integrations import vllm as plugin

# The dtypes vLLM stages through these helpers: token ids, positions and lengths, sampling
# parameters, masks, the prompt-embedding pointers (uint64) and inputs_embeds (16-bit floats).
H2D_DTYPES = [torch.int32, torch.int64, torch.float32, torch.bool, torch.uint64, torch.float16, torch.bfloat16]
POOL_DTYPES = [torch.int32, torch.int64, torch.float32, torch.uint64]
FORMS = ["list", "numpy", "tensor"]


@pytest.fixture(scope="module")
def vllm():
    from bench.engines import vllm_stubs

    yield vllm_stubs.load_vllm()
    vllm_stubs.unload_vllm()


@pytest.fixture
def cuda_staging(monkeypatch):
    """As where pinstage stages to CUDA (a CUDA build, a GPU visible): what plugin() asks first."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(pinstage._C, "built_with_cuda", True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv(plugin.SWITCH, raising=False)


@pytest.fixture
def enabled(vllm):
    plugin.enable()
    yield
    plugin.disable()


def _data(form, dtype, n, rng, shape=None):
    values = staging_reference.natural_values(dtype, n, rng)
    reference = torch.tensor(values, dtype=dtype)
    if shape is not None:
        reference = reference.reshape(shape)
    if form == "list":
        return reference.tolist()
    if form == "numpy" and dtype != torch.bfloat16:
        return reference.numpy()
    return reference


def _settle(tensor):
    """A copy of tensor, made before returning: vLLM's originals read host buffers that the next
    call rewrites (the race tested below), so each value test waits for the device here."""
    copy = tensor.clone()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return copy


def _staging_calls():
    return sum(pinstage.stats(device)["calls"] for device in ["cpu"] + ["cuda"] * torch.cuda.is_available())


def _plugin_and_original(run, staged=True):
    """run() with the plugin, then as vLLM has it; the plugin's run must have gone through pinstage
    (staged) or not at all."""
    calls = _staging_calls()
    plugin.enable()
    try:
        routed = run()
    finally:
        plugin.disable()
    assert (_staging_calls() > calls) == staged, "the plugin's run did not stage as expected"
    original = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return routed, original


def test_the_plugins_dtypes_are_those_pinstages_core_stages():
    for dtype in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}:
        try:
            pinstage._C._check_dtype(dtype, "dtype")
            assert dtype in plugin._DTYPES, dtype
        except TypeError:
            assert dtype not in plugin._DTYPES, dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", H2D_DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n", [0, 1, 256])
def test_async_tensor_h2d_gives_vllms_result(vllm, device, dtype, form, n, rng):
    data = _data(form, dtype, n, rng)
    # numpy arrays and tensors also without a dtype: vLLM keeps theirs
    for kwargs in [{"dtype": dtype}] + ([{}] if form != "list" else []):
        routed, original = _plugin_and_original(
            lambda: vllm.torch_utils.async_tensor_h2d(data, device=device, **kwargs)
        )
        assert_same_tensor(routed, original)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", H2D_DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_async_tensor_h2d_out_fills_vllms_values(vllm, device, dtype, form, rng):
    data = _data(form, dtype, 65, rng)

    def fill():
        out = torch.zeros(65, dtype=dtype, device=device)
        assert vllm.torch_utils.async_tensor_h2d(data, out=out) is out
        return out

    assert_same_tensor(*_plugin_and_original(fill))


@pytest.mark.parametrize("device", DEVICES)
def test_async_tensor_h2d_casts_arrays_like_vllm(vllm, device, rng):
    wide = np.array(staging_reference.natural_values(torch.int64, 100, rng))
    routed, original = _plugin_and_original(
        lambda: vllm.torch_utils.async_tensor_h2d(wide, device=device, dtype=torch.int32)
    )
    assert_same_tensor(routed, original)
    strided = torch.arange(40, dtype=torch.float32).reshape(5, 8)[:, ::3]
    routed, original = _plugin_and_original(
        lambda: vllm.torch_utils.async_tensor_h2d(strided.t(), device=device, dtype=torch.float64)
    )
    assert_same_tensor(routed, original)


def test_what_pinstage_does_not_cover_runs_vllms_own_code(vllm, enabled):
    h2d = vllm.torch_utils.async_tensor_h2d
    calls = _staging_calls()
    for data, kwargs in (
        ([1, 2.5], lambda: {"device": "cpu"}),  # a list without dtype: torch infers it
        (np.arange(3), lambda: {"device": "cpu", "dtype": torch.complex64}),
    ):
        assert_same_tensor(h2d(data, **kwargs()), h2d.__wrapped__(data, **kwargs()))
    assert _staging_calls() == calls
    with pytest.raises(AssertionError, match="must provide destination tensor or device"):
        h2d([1, 2], dtype=torch.int32)


@pytest.mark.parametrize("data", [np.arange(6).reshape(2, 3), [[1, 2, 3]], [7]], ids=["array", "nested", "one"])
def test_async_tensor_h2d_out_broadcasts_like_vllm(vllm, data):
    """vLLM's out.copy_(tensor) broadcasts data of another shape into out."""

    def fill():
        out = torch.zeros(4, 2, 3, dtype=torch.int64)
        assert vllm.torch_utils.async_tensor_h2d(data, out=out) is out
        return out

    assert_same_tensor(*_plugin_and_original(fill))


def _outcome(call):
    try:
        return "gives", call()
    except Exception as exc:  # the type and text vLLM's caller sees
        return type(exc), str(exc)


# Values numpy (vLLM's pools) or torch (async_tensor_h2d) refuses, or accepts where pinstage would not.
BAD_VALUES = [
    [300],
    [-1],
    [2**31],
    [2**63],
    [-(2**63) - 1],
    [2**64],
    [1e40],
    [float("nan")],
    [float("inf")],
    [1.5],
    ["3"],
    ["x"],
    [None],
    [object()],
    [[1, 2]],
    [b"1"],
    [1 + 2j],
    [np.int64(2**40)],
    [np.float64(1e300)],
]
BAD_DATA = [
    None,
    "abc",
    5,
    {"a": 1},
    np.array(["a"]),
    np.array([1 + 2j]),
    torch.tensor([1 + 2j]),
    np.zeros((2, 3)),
    np.array([300]),
    torch.zeros(2, device="meta"),
    [[1], [2]],
]
BAD_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.uint64, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
def test_bad_input_raises_what_vllms_own_function_raises(vllm, dtype):
    """A replaced function raises what vLLM's raises (an int8 pool given 300: numpy's OverflowError, on
    which an engine's `except OverflowError` relies) and gives what it gives where vLLM accepts."""
    calls = {
        "UvaBufferPool.copy_to_uva": lambda x: vllm.buffer_utils.UvaBufferPool(4, dtype).copy_to_uva(x),
        "UvaBufferPool.copy_to_gpu": lambda x: vllm.buffer_utils.UvaBufferPool((4, 2), dtype).copy_to_gpu(x),
        "UvaBufferPool.copy_to_gpu(out=)": lambda x: vllm.buffer_utils.UvaBufferPool(4, dtype).copy_to_gpu(
            x, out=torch.zeros(2, dtype=dtype)
        ),
        "async_tensor_h2d": lambda x: vllm.torch_utils.async_tensor_h2d(x, device="cpu", dtype=dtype),
        "async_tensor_h2d(out=)": lambda x: vllm.torch_utils.async_tensor_h2d(x, out=torch.zeros(2, dtype=dtype)),
    }
    differ = []
    for name, call in calls.items():
        for x in BAD_VALUES + BAD_DATA:
            original = _outcome(lambda: call(x))
            plugin.enable()
            try:
                routed = _outcome(lambda: call(x))
            finally:
                plugin.disable()
            same = (
                routed == original
                if original[0] != "gives"
                else routed[0] == "gives" and repr(_settle(routed[1])) == repr(_settle(original[1]))
            )
            if not same:
                differ.append((name, x, original, routed))
    assert not differ, differ


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("row_shape", [(), (3,)], ids=["rows", "rows_of_3"])
def test_uva_buffer_pool_gives_vllms_rows(vllm, dtype, form, row_shape, rng):
    size = 16 if not row_shape else (16, *row_shape)
    batches = [
        _data(form, dtype, n * (row_shape[0] if row_shape else 1), rng, (n, *row_shape))
        for n in (1, 16, 0, 40)
        if n or not row_shape
    ]  # 40 > 16: vLLM grows the slot

    def run():
        pool = vllm.buffer_utils.UvaBufferPool(size, dtype)
        results = []
        for x in batches:
            results.append(_settle(pool.copy_to_uva(x)))  # a UVA view changes when its slot is reused
            results.append(_settle(pool.copy_to_gpu(x)))
            out = torch.zeros((len(x), *row_shape), dtype=dtype, device=results[-1].device)
            assert pool.copy_to_gpu(x, out=out) is out
            results.append(_settle(out))
        return results

    # numpy checks a list's range for an unsigned pool (-1 raises; torch.tensor would wrap): vLLM's
    unsigned_list = form == "list" and dtype == torch.uint64
    for routed, original in zip(*_plugin_and_original(run, staged=not unsigned_list)):
        assert_same_tensor(routed, original)


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
def test_uva_backed_tensor_gives_vllms_rows(vllm, dtype, rng):
    values = torch.tensor(staging_reference.natural_values(dtype, 32, rng), dtype=dtype).numpy()

    def run():
        backed = vllm.buffer_utils.UvaBackedTensor(32, dtype)
        results = [_settle(backed.gpu)]
        for step, n in enumerate((None, 5, 32, 0)):
            backed.np[:] = np.roll(values, step)
            assert backed.copy_to_uva(n) is backed.gpu
            results.append(_settle(backed.gpu))
        return results

    for routed, original in zip(*_plugin_and_original(run)):
        assert_same_tensor(routed, original)


def test_uva_backed_tensor_unchanged_gets_its_rows_again_a_change_restages(vllm, enabled):
    backed = vllm.buffer_utils.UvaBackedTensor(32, torch.float32)
    backed.np[:] = np.arange(32)
    first = _settle(backed.copy_to_uva())
    kept = backed.gpu
    assert backed.copy_to_uva() is kept  # the same bytes: the rows staged for them, no copy
    backed.np[3] = 99.0
    backed.np[0] = -0.0  # equal to 0.0 for numpy, another value for the device
    changed = _settle(backed.copy_to_uva())
    assert changed is not kept
    assert_same_tensor(changed.cpu(), torch.from_numpy(backed.np.copy()))
    assert torch.signbit(changed[0]).item()
    assert_same_tensor(kept.cpu(), first.cpu())  # the rows given before keep their values
    assert backed.copy_to_uva(16).shape == (16,)  # another shape: staged, not the full rows again


def test_uva_buffer_pool_copy_to_gpu_gives_rows_of_its_own_every_call(vllm, enabled):
    pool = vllm.buffer_utils.UvaBufferPool(8, torch.int32)
    values = np.arange(8, dtype=np.int32)
    first = pool.copy_to_gpu(values)
    first.fill_(-1)  # the caller owns what copy_to_gpu gives (vLLM's is a clone)
    assert_same_tensor(_settle(pool.copy_to_gpu(values)).cpu(), torch.from_numpy(values))
    assert_same_tensor(_settle(pool.copy_to_uva(values)).cpu(), torch.from_numpy(values))


@pytest.mark.cuda
def test_unchanged_rows_are_not_given_to_another_stream(vllm, enabled):
    """The rows staged on one stream are given again only on that stream: another stream's kernels
    would read them unrecorded by the caching allocator, which could hand their memory on."""
    backed = vllm.buffer_utils.UvaBackedTensor(32, torch.int32)
    backed.np[:] = np.arange(32, dtype=np.int32)
    on_default = backed.copy_to_uva()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = backed.copy_to_uva()
        assert backed.copy_to_uva() is on_side
    assert on_side is not on_default
    torch.cuda.synchronize()
    assert_same_tensor(on_side.cpu(), torch.arange(32, dtype=torch.int32))


@pytest.mark.cuda
def test_repeated_values_in_flight_read_right(vllm, enabled):
    """Steps in flight whose host array repeats, changes and changes back: each step's kernel reads
    that step's values, also where its rows are the ones an earlier step staged."""
    backed = vllm.buffer_utils.UvaBackedTensor(4096, torch.int32)
    a, b = np.arange(4096, dtype=np.int32), np.arange(4096, dtype=np.int32)[::-1].copy()
    wanted = [a, a, b, b, a, b, a, a]
    backed.np[:] = a
    backed.copy_to_uva()
    torch.cuda.synchronize()

    def step(values):
        backed.np[:] = values
        return backed.copy_to_uva() + 0

    reads, still_busy = run_while_stream_busy(lambda: [step(values) for values in wanted])
    assert still_busy, "the GPU finished its sleep before the steps were queued; the test proved nothing"
    torch.cuda.synchronize()
    assert torch.equal(torch.stack(reads).cpu(), torch.from_numpy(np.stack(wanted)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", H2D_DTYPES, ids=str)
@pytest.mark.parametrize("size", [(64,), (64, 3)], ids=["1d", "2d"])
def test_cpu_gpu_buffer_copy_to_gpu_gives_vllms_rows(vllm, device, dtype, size, rng):
    steps = [None, 7, 0]
    values = [
        torch.tensor(staging_reference.natural_values(dtype, int(np.prod(size)), rng), dtype=dtype).reshape(size)
        for _ in steps
    ]

    def run():
        buffer = vllm.v1_utils.CpuGpuBuffer(
            *size, dtype=dtype, device=torch.device(device), with_numpy=dtype != torch.bfloat16
        )
        results = []
        for n, step_values in zip(steps, values):
            buffer.cpu.copy_(step_values)
            rows = buffer.copy_to_gpu(n)
            # vLLM's own device buffer, filled in place
            assert rows.untyped_storage().data_ptr() == buffer.gpu.untyped_storage().data_ptr()
            results.append(_settle(rows))
        return results

    for routed, original in zip(*_plugin_and_original(run)):
        assert_same_tensor(routed, original)


def _routed_helpers(vllm):
    return {
        "async_tensor_h2d": vllm.torch_utils.async_tensor_h2d,
        "buffer_utils.async_tensor_h2d": vllm.buffer_utils.async_tensor_h2d,
        "UvaBufferPool.copy_to_uva": vllm.buffer_utils.UvaBufferPool.copy_to_uva,
        "UvaBufferPool.copy_to_gpu": vllm.buffer_utils.UvaBufferPool.copy_to_gpu,
        "CpuGpuBuffer.copy_to_gpu": vllm.v1_utils.CpuGpuBuffer.copy_to_gpu,
    }


def test_enable_is_idempotent_and_disable_restores_every_original(vllm):
    originals = _routed_helpers(vllm)
    importer = "from vllm.utils.torch_utils import async_tensor_h2d"
    early, late = types.ModuleType("early_user"), types.ModuleType("late_user")
    exec(importer, vars(early))
    sys.modules.update(early_user=early, late_user=late)
    try:
        plugin.enable()
        routed = _routed_helpers(vllm)
        plugin.enable()
        assert _routed_helpers(vllm) == routed
        assert all(routed[name] is not originals[name] for name in originals)
        assert early.async_tensor_h2d is routed["async_tensor_h2d"]
        exec(importer, vars(late))  # imported after enable()
        assert late.async_tensor_h2d is routed["async_tensor_h2d"]
        plugin.disable()
        assert early.async_tensor_h2d is originals["async_tensor_h2d"]
        assert late.async_tensor_h2d is originals["async_tensor_h2d"]
        assert vllm.torch_utils.async_tensor_h2d is originals["async_tensor_h2d"]
    finally:
        plugin.disable()
        del sys.modules["early_user"], sys.modules["late_user"]


@pytest.mark.parametrize(
    "entry, refusal",
    [
        (
            "enable",
            lambda: pytest.raises(RuntimeError, match=r"vLLM 0\.34\.0 is not supported; tested with vLLM 0\.33\.0"),
        ),
        # vLLM loads every installed plugin when VLLM_PLUGINS is unset: under an untested vLLM the entry
        # point must let vLLM start, with its own helpers, and say why.
        (
            "plugin",
            lambda: pytest.warns(RuntimeWarning, match=r"vLLM 0\.34\.0 is not supported; tested with vLLM 0\.33\.0"),
        ),
    ],
)
def test_untested_vllm_versions_are_refused_and_nothing_changes(vllm, monkeypatch, cuda_staging, entry, refusal):
    originals = _routed_helpers(vllm)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.34.0")
    with refusal():
        getattr(plugin, entry)()
    assert _routed_helpers(vllm) == originals
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.33.0+cu130")
    getattr(plugin, entry)()
    routed = _routed_helpers(vllm)
    plugin.disable()
    assert all(routed[name] is not originals[name] for name in originals)


@pytest.mark.parametrize(
    "where, why",
    [
        ("no_gpu", "no CUDA device is visible"),
        ("cpu_build", "this pinstage was built without CUDA"),
        ("rocm", r"torch .* is a ROCm build"),
    ],
)
def test_the_plugin_declines_with_one_warning_where_pinstage_cannot_stage_to_cuda(
    vllm, monkeypatch, cuda_staging, where, why
):
    """vLLM loads every installed plugin: where pinstage cannot stage to vLLM's device, vLLM keeps its
    own helpers (before, the patched helpers raised "built without CUDA" or gave CPU tensors)."""
    if where == "no_gpu":
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    elif where == "cpu_build":
        monkeypatch.setattr(pinstage._C, "built_with_cuda", False)
    else:
        monkeypatch.setattr(torch.version, "hip", "6.4.0")
    originals = _routed_helpers(vllm)
    with pytest.warns(RuntimeWarning, match=why + ".*vLLM's own staging helpers stay in place") as caught:
        plugin.plugin()
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert _routed_helpers(vllm) == originals


def test_this_machines_pinstage_decides_without_pretending(vllm):
    """Here (CPU-only build, or a GPU machine with a CUDA build) plugin() routes exactly when
    pinstage stages to CUDA."""
    originals = _routed_helpers(vllm)
    can = torch.cuda.is_available() and pinstage._C.built_with_cuda and not torch.version.hip
    assert (pinstage._C.built_with_cuda and torch.cuda.is_available()) == (pinstage.stats()["device"] != "cpu")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plugin.plugin()
        assert (_routed_helpers(vllm) != originals) == can
        assert len(caught) == (0 if can else 1), [str(w.message) for w in caught]
    finally:
        plugin.disable()


def test_pinstage_vllm_0_switches_the_plugin_off(vllm, monkeypatch, cuda_staging, caplog):
    originals = _routed_helpers(vllm)
    for off in ("0", "off", "false"):
        monkeypatch.setenv(plugin.SWITCH, off)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plugin.plugin()
        assert _routed_helpers(vllm) == originals
    monkeypatch.setenv(plugin.SWITCH, "1")
    plugin.plugin()
    try:
        assert all(routed is not originals[name] for name, routed in _routed_helpers(vllm).items())
    finally:
        plugin.disable()


def test_activation_logs_one_line_naming_what_was_replaced(vllm, caplog):
    with caplog.at_level(logging.INFO, logger="pinstage"):
        plugin.enable()
        plugin.enable()
    plugin.disable()
    lines = [r.getMessage() for r in caplog.records if r.name == "pinstage"]
    assert len(lines) == 1, lines
    for name in (
        "async_tensor_h2d",
        "UvaBufferPool.copy_to_uva",
        "UvaBufferPool.copy_to_gpu",
        "CpuGpuBuffer.copy_to_gpu",
        "PINSTAGE_VLLM=0",
    ):
        assert name in lines[0]


def test_counters_count_calls_routed_and_calls_left_to_vllm(vllm, enabled):
    def delta(call):
        before = plugin.counters()
        call()
        after = plugin.counters()
        return {
            name: (after[name]["routed"] - before[name]["routed"], after[name]["to_vllm"] - before[name]["to_vllm"])
            for name in after
            if after[name] != before.get(name)
        }

    h2d = vllm.torch_utils.async_tensor_h2d
    assert delta(lambda: h2d([1, 2], device="cpu", dtype=torch.int32)) == {"async_tensor_h2d": (1, 0)}
    assert delta(lambda: h2d([1, 2], device="cpu")) == {"async_tensor_h2d": (0, 1)}  # no dtype: vLLM's
    pool = vllm.buffer_utils.UvaBufferPool(4, torch.int8)
    assert delta(lambda: pool.copy_to_uva([1, 2])) == {"UvaBufferPool.copy_to_uva": (1, 0)}
    with pytest.raises(OverflowError):
        pool.copy_to_uva([300])
    assert plugin.counters()["UvaBufferPool.copy_to_uva"]["to_vllm"] >= 1
    buffer = vllm.v1_utils.CpuGpuBuffer(4, dtype=torch.int32, device=torch.device("cpu"))
    assert delta(buffer.copy_to_gpu) == {"CpuGpuBuffer.copy_to_gpu": (1, 0)}


@pytest.mark.parametrize("target", ["meta", "cuda_unserved"])
def test_a_device_pinstage_cannot_stage_to_gets_vllms_own_function(vllm, enabled, monkeypatch, target):
    """Per call: a target pinstage does not stage to (the meta device; CUDA where this pinstage has
    no CUDA, forced here) runs vLLM's function, whose result keeps vLLM's device (before: pinstage
    raised, or gave CPU tensors)."""
    device = target.split("_")[0]  # no GPU needed: CUDA is forced unserved, so vLLM's function runs
    if device == "cuda":
        monkeypatch.setattr(plugin, "_cuda_served", False)
    calls = _staging_calls()
    h2d = vllm.torch_utils.async_tensor_h2d
    assert _outcome(lambda: h2d([1, 2], device=device, dtype=torch.int32).device) == _outcome(
        lambda: h2d.__wrapped__([1, 2], device=device, dtype=torch.int32).device
    )
    if device == "meta":
        buffer = vllm.v1_utils.CpuGpuBuffer(4, dtype=torch.int32, device=torch.device("meta"))
        assert buffer.copy_to_gpu().device == torch.device("meta")
    assert _staging_calls() == calls


def test_disable_leaves_a_wrapper_installed_after_enable(vllm):
    originals = _routed_helpers(vllm)
    pool_cls = vllm.buffer_utils.UvaBufferPool
    plugin.enable()
    other = functools.wraps(pool_cls.copy_to_uva)(lambda self, x: "other")
    pool_cls.copy_to_uva = other  # another library's wrapper, installed while pinstage is enabled
    plugin.disable()
    try:
        assert pool_cls.__dict__["copy_to_uva"] is other
        assert {k: v for k, v in _routed_helpers(vllm).items() if k != "UvaBufferPool.copy_to_uva"} == {
            k: v for k, v in originals.items() if k != "UvaBufferPool.copy_to_uva"
        }
    finally:
        pool_cls.copy_to_uva = originals["UvaBufferPool.copy_to_uva"]


def test_the_entry_point_is_declared_for_vllm():
    pyproject = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["vllm.general_plugins"]["pinstage"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is plugin.plugin


def test_importing_the_plugin_imports_no_vllm():
    code = "import sys, pinstage.integrations.vllm; print(any(m.split('.')[0] == 'vllm' for m in sys.modules))"
    out = run_child(code, timeout=120)
    assert out.strip() == "False"


@pytest.mark.cuda
def test_enable_does_not_initialise_cuda(vllm):
    code = textwrap.dedent("""
        import sys, torch
        from bench.engines import vllm_stubs
        vllm_stubs.load_vllm()
        from pinstage.integrations import vllm
        vllm.enable()
        print(torch.cuda.is_initialized())
    """)
    out = run_child(code, timeout=300)
    assert out.strip().splitlines()[-1] == "False"


def test_a_vllm_the_plugin_cannot_patch_whole_starts_as_shipped(vllm, monkeypatch, cuda_staging):
    """A helper missing where enable() replaces it (a vLLM build that moved it): plugin() warns once,
    raises nothing (vLLM calls plugins unguarded) and leaves none of the helpers patched."""
    moved = type("CpuGpuBuffer", (vllm.v1_utils.CpuGpuBuffer,), {})  # copy_to_gpu only inherited
    monkeypatch.setattr(vllm.v1_utils, "CpuGpuBuffer", moved)  # the last of the four replaced
    originals = _routed_helpers(vllm)
    with pytest.warns(RuntimeWarning, match="KeyError.*vLLM's own staging helpers stay in place"):
        plugin.plugin()
    assert _routed_helpers(vllm) == originals
    assert not plugin._patches


def test_deciding_makes_no_cuda_runtime_call(vllm, monkeypatch):
    """plugin() decides without cudaGetDeviceCount (torch.cuda.is_available()'s call), which
    initialises the driver: vLLM forks its workers after loading plugins, and a child of a process
    whose driver is initialised cannot use CUDA. torch.cuda.device_count() asks NVML first."""

    def initialises_the_driver():
        raise AssertionError("cudaGetDeviceCount was called")

    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", initialises_the_driver)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 1)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", None)
    monkeypatch.setattr(pinstage._C, "built_with_cuda", True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert plugin._no_cuda_staging() is None


@pytest.mark.cuda
def test_a_forked_child_uses_cuda_after_the_plugin_loaded(vllm):
    """As vLLM's default "fork" workers: the plugin loads in the parent, a forked child then uses CUDA."""
    code = textwrap.dedent("""
        import os, sys, torch
        from bench.engines import vllm_stubs
        vllm_stubs.load_vllm()
        from pinstage.integrations import vllm
        vllm.plugin()
        pid = os.fork()
        if pid == 0:
            ok = torch.zeros(3, device="cuda").add(1).sum().item() == 3
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), "parent initialised", torch.cuda.is_initialized())
    """)
    out = run_child(code, timeout=300)
    assert out.strip().splitlines()[-1] == "child exit 0 parent initialised False", out


def _steps_behind_busy_kernel(vllm, steps, n):
    """`steps` scheduler steps queued behind a long kernel: each writes its values into every helper
    and enqueues a kernel that reads what the helper gave, as vLLM's model runner does; the host
    rewrites CpuGpuBuffer's source right after copy_to_gpu. Returns the wrong values per helper and
    whether the long kernel was still running when the host had queued every step."""
    pool = vllm.buffer_utils.UvaBufferPool(n, torch.int32)
    backed = vllm.buffer_utils.UvaBackedTensor(n, torch.int32)
    buffer = vllm.v1_utils.CpuGpuBuffer(n, dtype=torch.int32, device=torch.device("cuda"))

    def step(values):
        backed.np[:] = values
        buffer.np[:] = values
        read = {
            "UvaBufferPool": pool.copy_to_uva(values) + 0,
            "UvaBackedTensor": backed.copy_to_uva() + 0,
            "CpuGpuBuffer": buffer.copy_to_gpu() + 0,
            "async_tensor_h2d": vllm.torch_utils.async_tensor_h2d(values, "cuda") + 0,
        }
        buffer.np[:] = -1  # the next step's preparation starts at once
        return read

    wanted = [(np.arange(n) + k * n).astype(np.int32) for k in range(steps)]
    step(wanted[0])  # loads the kernels and allocates the ring before the clock matters
    torch.cuda.synchronize()
    reads, still_busy = run_while_stream_busy(lambda: [step(values) for values in wanted])
    torch.cuda.synchronize()
    want = torch.from_numpy(np.stack(wanted))
    wrong = {name: int((torch.stack([r[name] for r in reads]).cpu() != want).sum()) for name in reads[0]}
    return wrong, still_busy


@pytest.mark.cuda
def test_more_steps_in_flight_than_the_pool_depth_serve_no_wrong_values(vllm):
    steps = 4 * vllm.buffer_utils._DEFAULT_MAX_CONCURRENCY
    original, original_busy = _steps_behind_busy_kernel(vllm, steps, 4096)
    plugin.enable()
    try:
        routed, routed_busy = _steps_behind_busy_kernel(vllm, steps, 4096)
    finally:
        plugin.disable()
    assert original_busy and routed_busy, "the GPU finished before the steps were queued: nothing was in flight"
    assert routed == dict.fromkeys(routed, 0), routed
    # vLLM's own helpers reuse memory the GPU has not read yet: the race the plugin removes.
    assert original["UvaBufferPool"] > 0 and original["UvaBackedTensor"] > 0, original
    assert original["CpuGpuBuffer"] > 0, original
    assert original["async_tensor_h2d"] == 0, original  # a pinned tensor per call: slow, not wrong


@pytest.mark.cuda
def test_a_capturing_stream_gets_vllms_own_code(vllm, enabled):
    pool = vllm.buffer_utils.UvaBufferPool(8, torch.int32)
    values = np.arange(8, dtype=np.int32)
    staged = pool.copy_to_uva(values)  # kept: the same values get these rows again, uncopied
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = pool.copy_to_uva(values)  # pinstage refuses a capturing stream; vLLM's pool does not
    torch.cuda.synchronize()
    assert rows is not staged  # a graph must not keep rows that a later change lets go
    assert torch.equal(rows.cpu(), torch.from_numpy(values))
