"""pinstage.integrations.vllm on vLLM 0.33's own modules (the wheel's source, heavy imports stood in).

Every output is compared with what vLLM's original gives for the same input (values, dtype, shape,
device); on CUDA, with more steps in flight than the UVA pool's depth behind a busy kernel, the
originals serve wrong values (reproduced here) and the plugin none.
"""
import importlib
import pathlib
import subprocess
import sys
import textwrap
import tomllib
import types

import gpu_busy
import numpy as np
import pytest
import staging_reference
import torch
from staging_reference import assert_same_tensor
from support import BUSY_MS, DEVICES

import pinstage
import pinstage.testing
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


def _plugin_and_original(run):
    """run() with the plugin, then as vLLM has it; the plugin's run must have gone through pinstage."""
    calls = _staging_calls()
    plugin.enable()
    try:
        routed = run()
    finally:
        plugin.disable()
    assert _staging_calls() > calls, "the plugin's run did not stage through pinstage"
    original = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return routed, original


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", H2D_DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n", [0, 1, 256])
def test_async_tensor_h2d_gives_vllms_result(vllm, device, dtype, form, n, rng):
    data = _data(form, dtype, n, rng)
    # numpy arrays and tensors also without a dtype: vLLM keeps theirs
    for kwargs in [{"dtype": dtype}] + ([{}] if form != "list" else []):
        routed, original = _plugin_and_original(
            lambda: vllm.torch_utils.async_tensor_h2d(data, device=device, **kwargs))
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
        lambda: vllm.torch_utils.async_tensor_h2d(wide, device=device, dtype=torch.int32))
    assert_same_tensor(routed, original)
    strided = torch.arange(40, dtype=torch.float32).reshape(5, 8)[:, ::3]
    routed, original = _plugin_and_original(
        lambda: vllm.torch_utils.async_tensor_h2d(strided.t(), device=device, dtype=torch.float64))
    assert_same_tensor(routed, original)


def test_what_pinstage_does_not_cover_runs_vllms_own_code(vllm, enabled):
    h2d = vllm.torch_utils.async_tensor_h2d
    calls = _staging_calls()
    for data, kwargs in (([1, 2.5], lambda: {"device": "cpu"}),  # a list without dtype: torch infers it
                         (np.arange(3), lambda: {"device": "cpu", "dtype": torch.complex64}),
                         (np.arange(6).reshape(2, 3), lambda: {"out": torch.zeros(4, 2, 3, dtype=torch.int64)})):
        assert_same_tensor(h2d(data, **kwargs()), h2d.__wrapped__(data, **kwargs()))
    assert _staging_calls() == calls
    with pytest.raises(AssertionError, match="must provide destination tensor or device"):
        h2d([1, 2], dtype=torch.int32)


def test_bad_values_raise_what_vllm_raises_naming_the_element(vllm):
    data = [1, 2, "three"]
    with pytest.raises(Exception) as original:
        vllm.torch_utils.async_tensor_h2d(data, device="cpu", dtype=torch.int64)
    with pytest.raises(type(original.value), match=r"\[2\] = 'three'.*int64"):
        plugin.enable()
        try:
            vllm.torch_utils.async_tensor_h2d(data, device="cpu", dtype=torch.int64)
        finally:
            plugin.disable()


@pytest.mark.parametrize("dtype", POOL_DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("row_shape", [(), (3,)], ids=["rows", "rows_of_3"])
def test_uva_buffer_pool_gives_vllms_rows(vllm, dtype, form, row_shape, rng):
    size = 16 if not row_shape else (16, *row_shape)
    batches = [_data(form, dtype, n * (row_shape[0] if row_shape else 1), rng, (n, *row_shape))
               for n in (1, 16, 0, 40) if n or not row_shape]  # 40 > 16: vLLM grows the slot

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

    for routed, original in zip(*_plugin_and_original(run)):
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", H2D_DTYPES, ids=str)
@pytest.mark.parametrize("size", [(64,), (64, 3)], ids=["1d", "2d"])
def test_cpu_gpu_buffer_copy_to_gpu_gives_vllms_rows(vllm, device, dtype, size, rng):
    steps = [None, 7, 0]
    values = [torch.tensor(staging_reference.natural_values(dtype, int(np.prod(size)), rng), dtype=dtype).reshape(size)
              for _ in steps]

    def run():
        buffer = vllm.v1_utils.CpuGpuBuffer(*size, dtype=dtype, device=torch.device(device),
                                           with_numpy=dtype != torch.bfloat16)
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
    return {"async_tensor_h2d": vllm.torch_utils.async_tensor_h2d,
            "buffer_utils.async_tensor_h2d": vllm.buffer_utils.async_tensor_h2d,
            "UvaBufferPool.copy_to_uva": vllm.buffer_utils.UvaBufferPool.copy_to_uva,
            "UvaBufferPool.copy_to_gpu": vllm.buffer_utils.UvaBufferPool.copy_to_gpu,
            "CpuGpuBuffer.copy_to_gpu": vllm.v1_utils.CpuGpuBuffer.copy_to_gpu}


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


@pytest.mark.parametrize("entry, refusal", [
    ("enable", lambda: pytest.raises(RuntimeError, match=r"vLLM 0\.34\.0 is not supported; tested with vLLM 0\.33\.0")),
    # vLLM loads every installed plugin when VLLM_PLUGINS is unset: under an untested vLLM the entry
    # point must let vLLM start, with its own helpers, and say why.
    ("plugin", lambda: pytest.warns(RuntimeWarning, match=r"vLLM 0\.34\.0 is not supported; tested with vLLM 0\.33\.0")),
])
def test_untested_vllm_versions_are_refused_and_nothing_changes(vllm, monkeypatch, entry, refusal):
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


def test_the_entry_point_is_declared_for_vllm():
    pyproject = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["vllm.general_plugins"]["pinstage"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is plugin.plugin


def test_importing_the_plugin_imports_no_vllm():
    code = "import sys, pinstage.integrations.vllm; print(any(m.split('.')[0] == 'vllm' for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


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
        read = {"UvaBufferPool": pool.copy_to_uva(values) + 0,
                "UvaBackedTensor": backed.copy_to_uva() + 0,
                "CpuGpuBuffer": buffer.copy_to_gpu() + 0,
                "async_tensor_h2d": vllm.torch_utils.async_tensor_h2d(values, "cuda") + 0}
        buffer.np[:] = -1  # the next step's preparation starts at once
        return read

    wanted = [(np.arange(n) + k * n).astype(np.int32) for k in range(steps)]
    step(wanted[0])  # loads the kernels and allocates the ring before the clock matters
    torch.cuda.synchronize()
    busy = gpu_busy.busy(BUSY_MS)
    with pinstage.testing.no_sync():
        reads = [step(values) for values in wanted]
    still_busy = not busy.query()
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
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = pool.copy_to_uva(values)  # pinstage refuses a capturing stream; vLLM's pool does not
    torch.cuda.synchronize()
    assert torch.equal(rows.cpu(), torch.from_numpy(values))
