"""Python code that runs in the middle of a staging (an element's __index__, the torch.tensor
fallback) and tensors whose storage is not their values: each case once crashed, read freed or
foreign memory, or staged other values than torch.tensor gives. Cases that could crash or hang run
in a subprocess (support.expect_in_child); each child ends by checking that pinstage still works.
"""

import textwrap
import warnings

import numpy as np
import pytest
import torch
from support import DEVICES, expect_in_child

import pinstage

# Defined in each child: an object whose __index__ runs `action` once, then converts as 5.
HOOK = """
import numpy as np

class Hook:
    def __init__(self, action):
        self.action = action
    def __index__(self):
        action, self.action = self.action, (lambda: None)
        action()
        return 5
"""


def child(body, device, timeout=300, prelude=""):
    return expect_in_child(HOOK + prelude + textwrap.dedent(body), device, timeout)


@pytest.mark.parametrize("device", DEVICES)
def test_stage_into_out_storage_resized_by_an_element(device):
    """An element's __index__ shrinks out's storage in place (same tensor, same numel): nothing is
    written past it, and the neighbouring tensors keep their values."""
    out = child(
        """
        out = torch.full((4096,), 7, dtype=torch.int64, device=DEVICE)
        neighbours = [torch.full((4096,), 3, dtype=torch.int64, device=DEVICE) for _ in range(8)]
        data = [1] * 4095 + [Hook(lambda: out.untyped_storage().resize_(8))]
        expect(lambda: pinstage.stage_into(data, out), RuntimeError, "out changed")
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        assert all(n.cpu().eq(3).all() for n in neighbours)
        print("neighbours intact")
        """,
        device,
    )
    assert "neighbours intact" in out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["tensor", "numpy"])
def test_stage_many_earlier_item_freed_by_a_later_item(device, source):
    """Item 1's conversion frees item 0's memory (tensor storage resized to 0 bytes, numpy array
    resized to one element): item 0 is what torch.tensor gave before item 1 ran, never heap bytes."""
    child(
        """
        values = list(range(100, 100 + 4096))
        if %r == "tensor":
            a = torch.tensor(values, dtype=torch.int64)
            shrink = lambda: a.untyped_storage().resize_(0)
        else:
            a = np.array(values, dtype=np.int64)
            shrink = lambda: a.resize(1, refcheck=False)
        expected = torch.tensor(a, dtype=torch.int32)
        got = pinstage.stage_many([(a, torch.int32), ([Hook(shrink)], torch.int64)], device=DEVICE)
        assert got[0].cpu().equal(expected), got[0][:8]
        assert got[1].cpu().tolist() == [5]
        """
        % source,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["list", "numpy", "tensor", "array"])
def test_stage_many_earlier_item_mutated_by_a_later_item(device, source):
    """Item 1's __index__ sets item 0's first element to 99: item 0 keeps the values it had when
    torch.tensor, applied item by item, would have read it."""
    child(
        """
        import array
        make = {"list": list, "numpy": np.array, "tensor": torch.tensor, "array": lambda v: array.array("q", v)}
        a = make[%r]([1, 2, 3])

        def mutate():
            a[0] = 99

        got = pinstage.stage_many([(a, torch.int64), ([Hook(mutate)], torch.int64)], device=DEVICE)
        assert got[0].cpu().tolist() == [1, 2, 3], got[0]
        assert a[0] == 99
        """
        % source,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_stage_many_items_list_mutated_by_an_item(device):
    """stage_many reads a list of items in place (no copy): an item whose conversion empties the list
    is a ValueError naming it, never a read of freed pairs; a later pair replaced meanwhile is read
    when its turn comes, as torch.tensor applied item by item would read it."""
    child(
        """
        items = []
        items += [([Hook(lambda: items.clear())], torch.int64)] + [([i] * 64, torch.int64) for i in range(50)]
        expect(lambda: pinstage.stage_many(items, device=DEVICE), ValueError, "items changed length", "item 0")
        items = [([Hook(lambda: items.__setitem__(1, ([7, 8], torch.int32)))], torch.int64), ([1], torch.int64)]
        got = pinstage.stage_many(items, device=DEVICE)
        assert got[0].cpu().tolist() == [5] and got[1].cpu().tolist() == [7, 8], got
        assert got[1].dtype == torch.int32
        """,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["tensor", "numpy"])
def test_stage_many_later_item_resized_while_an_earlier_item_is_written(device, source):
    """Item 0 is planned by the fast path and falls back to torch.tensor only when written; its
    __index__ then resizes item 1's memory, which was looked at before: a clear error, no read of
    freed memory."""
    child(
        """
        if %r == "tensor":
            b = torch.arange(4096, dtype=torch.int64)
            shrink = lambda: b.untyped_storage().resize_(8)
        else:
            b = np.arange(4096, dtype=np.int64)
            shrink = lambda: b.resize(1, refcheck=False)
        expect(lambda: pinstage.stage_many([([1, Hook(shrink)], torch.int64), (b, torch.int64)], device=DEVICE),
               RuntimeError, "item 1", "changed")
        """
        % source,
        device,
    )


# A _make_wrapper_subclass tensor (the DTensor / torchao style): no storage of its own; every op
# goes through __torch_dispatch__ to the tensor it wraps.
WRAPPER = """
from torch.utils._pytree import tree_map

class Wrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.elem if isinstance(x, Wrapper) else x
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_without_memory_as_data(device):
    """Data tensors whose data pointer is null: torch.tensor converts those it can (a wrapper
    subclass dispatches to its contents, a zero tensor is zeros); a FakeTensor is refused."""
    child(
        """
        from torch._subclasses import FakeTensorMode
        source = torch.tensor([1.5, -2.0, 3.0])
        wrapped = Wrapper(source)
        zeros = torch._efficientzerotensor(4)
        with FakeTensorMode():
            fake = torch.ones(3)
        for data in (wrapped, zeros):
            expected = torch.tensor(data, dtype=torch.int32)
            got = pinstage.stage_to_device(data, torch.int32, device=DEVICE)
            assert type(got) is torch.Tensor and got.cpu().equal(expected), (got, expected)
            many = pinstage.stage_many([(data, torch.int32), ([7], torch.int64)], device=DEVICE)
            assert many[0].cpu().equal(expected) and many[1].cpu().tolist() == [7]
        expect(lambda: pinstage.stage_to_device(fake, torch.float32, device=DEVICE), TypeError, "FakeTensor")
        expect(lambda: pinstage.stage_many([([1], torch.int64), (fake, torch.float32)], device=DEVICE), TypeError,
               "item 1", "FakeTensor")
        """,
        device,
        prelude=WRAPPER,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_without_memory_as_out(device):
    child(
        """
        from torch._subclasses import FakeTensorMode
        wrapped = Wrapper(torch.zeros(4, device=DEVICE))
        zeros = torch._efficientzerotensor(4, device=DEVICE)
        with FakeTensorMode():
            fake = torch.empty(4, device=DEVICE)
        for out in (wrapped, zeros, fake):
            expect(lambda: pinstage.stage_into([1.0, 2.0, 3.0, 4.0], out), TypeError, "out", type(out).__name__)
        assert wrapped.elem.cpu().tolist() == [0.0] * 4
        """,
        device,
        prelude=WRAPPER,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_staging_under_fake_tensor_mode(device):
    """pinstage's own allocations are made with Python dispatch modes excluded: the results are
    real tensors holding the values; an item torch.tensor must convert gives a FakeTensor there,
    which is refused. Inside the mode the child runs no torch op on a real tensor (FakeTensorMode
    refuses one with an AssertionError; `.cpu()` of a CPU tensor is no op, of a CUDA tensor it is),
    so both devices check the same thing."""
    child(
        """
        from torch._subclasses import FakeTensorMode
        out = torch.zeros(3, dtype=torch.int64, device=DEVICE)
        with FakeTensorMode():
            one = pinstage.stage_to_device([1, 2, 3], torch.int64, device=DEVICE)
            many = pinstage.stage_many([([1, 2], torch.int64), (np.arange(3), torch.float32)], device=DEVICE)
            pinstage.stage_into([4, 5, 6], out)
            try:
                pinstage.stage_to_device([np.int64(1)], torch.int64, device=DEVICE)
            except TypeError as exc:
                refused = str(exc)
            else:
                refused = None
        assert refused is not None and "FakeTensor" in refused, refused
        assert type(one) is torch.Tensor and one.cpu().tolist() == [1, 2, 3]
        assert [type(t) for t in many] == [torch.Tensor] * 2
        assert many[0].cpu().tolist() == [1, 2] and many[1].cpu().tolist() == [0.0, 1.0, 2.0]
        assert out.cpu().tolist() == [4, 5, 6]
        """,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_and_nested_tensors_are_refused(device):
    child(
        """
        import warnings
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
        expect(lambda: pinstage.stage_to_device(quantized, torch.float32, device=DEVICE), TypeError, "quantized",
               "torch.qint8")
        expect(lambda: pinstage.stage_to_device(nested, torch.float32, device=DEVICE), TypeError, "nested")
        expect(lambda: pinstage.stage_many([([1], torch.int64), (nested, torch.float32)], device=DEVICE), TypeError,
               "item 1", "nested")
        """,
        device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_neg_and_conj_views_are_resolved(device):
    source = torch.tensor([1.5, -2.0, 3.0])
    for data in (source._neg_view(), torch.tensor([1 + 2j, 3 - 4j]).conj().imag):
        expected = torch.tensor(data, dtype=torch.float32)
        got = pinstage.stage_to_device(data, torch.float32, device=device)
        assert got.cpu().equal(expected), (got, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_stage_into_a_neg_view_is_refused(device):
    """Bytes written into a neg view's storage read back negated: refused, out left as it was."""
    base = torch.tensor([1.0, 2.0], device=device)
    out = base._neg_view()
    with pytest.raises(ValueError, match="negative view"):
        pinstage.stage_into([5.0, 6.0], out)
    assert base.cpu().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("device", DEVICES)
def test_error_search_is_linear_in_shared_sublists(device):
    """x = [x, x] 62 times is 63 objects and 2**62 leaves: torch.tensor raises at once, and so
    must pinstage (the search for the refused element must not walk the tree)."""
    child(
        """
        import time
        x = np.int64(1)
        for _ in range(62):
            x = [x, x]
        start = time.perf_counter()
        expect(lambda: pinstage.stage_to_device(x, torch.int64, device=DEVICE), RuntimeError, "overflow")
        assert time.perf_counter() - start < 5.0
        """,
        device,
        timeout=60,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_error_search_stops_at_the_refused_element_in_about_torchs_time(device):
    child(
        """
        import time
        data = [np.int64(1)] * 2_000_000 + ["x"]
        start = time.perf_counter()
        try:
            torch.tensor(data, dtype=torch.int64)
        except TypeError:
            pass
        torch_seconds = time.perf_counter() - start
        start = time.perf_counter()
        expect(lambda: pinstage.stage_to_device(data, torch.int64, device=DEVICE), TypeError, "[2000000]", "'x'",
               "torch.int64")
        seconds = time.perf_counter() - start
        print("torch %.2f s, pinstage %.2f s" % (torch_seconds, seconds))
        assert seconds < 6 * torch_seconds + 0.5, (seconds, torch_seconds)
        """,
        device,
        timeout=120,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("default", ["meta", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("how", ["set_default_device", "with"])
def test_fallback_builds_on_the_cpu_whatever_the_default_device(device, default, how):
    """The fallback's tensor is read from host memory, so torch.set_default_device("cuda") or a
    `with torch.device(...)` block must not move it (a "meta" default stands in for CUDA here)."""
    import numpy as np

    data = [np.int64(3), np.int64(-4)]
    bad = [np.int64(3), "x"]
    expected = torch.tensor(data, dtype=torch.int64, device="cpu")
    previous = torch.get_default_device()
    context = torch.device(default)
    try:
        if how == "set_default_device":
            torch.set_default_device(default)
        else:
            context.__enter__()
        got = pinstage.stage_to_device(data, torch.int64, device=device)
        many = pinstage.stage_many([(data, torch.int64), ([1, np.float32(2.5)], torch.float32)], device=device)
        with pytest.raises(TypeError, match=r"element \[1\] = 'x'"):
            pinstage.stage_to_device(bad, torch.int64, device=device)
    finally:
        if how == "set_default_device":
            torch.set_default_device(previous)
        else:
            context.__exit__(None, None, None)
    assert got.device.type == device and got.cpu().equal(expected)
    assert many[0].cpu().equal(expected) and many[1].cpu().tolist() == [1.0, 2.5]


@pytest.mark.parametrize("device", DEVICES)
def test_fallbacks_are_counted_when_planned_and_when_written(device):
    """stats()["fallbacks"] counts each item torch.tensor converted, whether the fast paths declined
    it when it was planned ([np.int64]) or only when it was written ([1, np.int64]), for every entry
    point."""
    import numpy as np

    before = pinstage.stats(device=device)["fallbacks"]
    pinstage.stage_many(
        [([np.int64(1)], torch.int64), ([1, np.int64(2)], torch.int64), ([1, 2], torch.int64)], device=device
    )
    pinstage.stage_to_device([np.int64(1)], torch.int64, device=device)
    pinstage.stage_to_device([1, np.int64(2)], torch.int64, device=device)
    out = torch.zeros(2, dtype=torch.int64, device=device)
    pinstage.stage_into([np.int64(1), np.int64(2)], out)
    pinstage.stage_into([1, np.int64(2)], out)
    assert pinstage.stats(device=device)["fallbacks"] - before == 6
    assert out.tolist() == [1, 2]


class _IterSeven(list):
    def __iter__(self):
        return iter([7] * len(self))


class _LongerThanItIs(list):
    def __len__(self):
        return 5


class _TupleIterSeven(tuple):
    def __iter__(self):
        return iter([7] * len(self))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make",
    [
        lambda: _IterSeven([1, 2, 3]),
        lambda: _TupleIterSeven((1, 2, 3)),
        lambda: [_IterSeven([1, 2, 3]), [4, 5, 6]],
        lambda: [[4, 5, 6], _IterSeven([1, 2, 3])],
        lambda: _LongerThanItIs([1, 2, 3]),
    ],
    ids=["list-iter", "tuple-iter", "nested-first", "nested-second", "len"],
)
def test_sequence_subclasses_take_torchs_path(device, make):
    try:
        expected = torch.tensor(make(), dtype=torch.int64)
    except Exception as exc:  # torch refuses it: pinstage raises the same type
        with pytest.raises(type(exc)):
            pinstage.stage_to_device(make(), torch.int64, device=device)
        return
    assert pinstage.stage_to_device(make(), torch.int64, device=device).cpu().equal(expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float32])
def test_memoryview_of_bool_bytes_reads_any_nonzero_byte_as_true(device, dtype):
    view = memoryview(bytearray([0, 1, 2, 255])).cast("?")
    expected = torch.tensor(view, dtype=dtype)
    assert expected.tolist() == torch.tensor([False, True, True, True], dtype=dtype).tolist()
    got = pinstage.stage_to_device(view, dtype, device=device)
    assert got.cpu().equal(expected)
    if dtype == torch.bool:  # a bool byte other than 0 or 1 is not a valid bool, whatever equal() says
        assert got.cpu().view(torch.uint8).tolist() == [0, 1, 1, 1]
    assert pinstage.stage_to_device(view[1:3], dtype, device=device).cpu().equal(expected[1:3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ctype", ["c_int64", "c_double", "c_bool", "c_int32", "c_uint8"])
def test_memoryview_with_explicit_byte_order_raises_as_torch(device, ctype):
    """ctypes arrays export formats such as '<q'; torch.tensor cannot read them as a sequence and
    raises ValueError, and so does pinstage."""
    import ctypes

    view = memoryview((getattr(ctypes, ctype) * 3)(1, 0, 1))
    assert view.format[0] in "<>"
    with pytest.raises(ValueError) as torch_error:
        torch.tensor(view, dtype=torch.int64)
    with pytest.raises(ValueError, match="could not determine the shape") as ours:
        pinstage.stage_to_device(view, torch.int64, device=device)
    assert type(ours.value) is type(torch_error.value)


@pytest.mark.parametrize("device", DEVICES)
def test_static_inputs_under_fake_tensor_mode(device):
    """A StaticInputs (and the builders' batch_static_inputs) made and staged under FakeTensorMode is
    real memory holding the fills and the values, as stage_to_device's results are there. Its fill
    was once a FakeTensor whose null data pointer the constructor copied from (a segfault). The
    child uses CUDA first inside the mode, where torch's lazy CUDA initialisation does nothing
    unless pinstage sets the mode aside for it."""
    child(
        """
        from torch._subclasses import FakeTensorMode
        from pinstage.builders import batch_static_inputs
        fields = {"a": pinstage.Field(torch.int64, fill=5), "b": pinstage.Field(torch.float32, (2,), fill=1.5)}
        with FakeTensorMode():
            inputs = pinstage.StaticInputs(fields, max_bs=4, device=DEVICE)
            batch = batch_static_inputs(3, device=DEVICE)
            inputs.stage({"a": [1, 2], "b": np.ones((2, 2), np.float32)}, 2)
        views = [inputs[name] for name in inputs.names] + [batch[name] for name in batch.names]
        assert all(type(v) is torch.Tensor for v in views), [type(v) for v in views]
        assert inputs["a"].cpu().tolist() == [1, 2, 5, 5]
        assert inputs["b"].cpu().tolist() == [[1.0, 1.0], [1.0, 1.0], [1.5, 1.5], [1.5, 1.5]]
        assert batch["seq_lens"].cpu().tolist() == [1, 1, 1] and batch["temperatures"].cpu().tolist() == [[1.0]] * 3
        print("real")
        """,
        device,
        timeout=120,
    )


def bool_sources():
    """Bool data whose bytes are not all 0 or 1 (uint8 memory viewed as bool): numpy arrays and CPU
    tensors, contiguous, strided and 2-D."""
    raw = np.array([0, 1, 2, 255, 7, 0, 128, 1], np.uint8)
    flat = raw.view(np.bool_)
    tensor = torch.from_numpy(raw.copy()).view(torch.bool)
    return {
        "numpy": flat,
        "numpy_strided": flat[1::2],
        "numpy_2d": flat.reshape(2, 4),
        "numpy_2d_transposed": flat.reshape(2, 4).T,
        "tensor": tensor,
        "tensor_strided": tensor[1::2],
        "tensor_2d": tensor.reshape(2, 4),
    }


def torch_tensor_bytes(data, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(a_tensor) recommends clone()
        return torch.tensor(data, dtype=dtype).contiguous().view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype",
    [torch.bool, torch.uint8, torch.int64, torch.float32, torch.bfloat16],
    ids=lambda d: str(d).replace("torch.", ""),
)
@pytest.mark.parametrize("source", list(bool_sources()))
def test_bool_bytes_other_than_0_and_1_are_staged_as_torch_tensor_reads_them(device, dtype, source):
    """torch.tensor reads any nonzero bool byte as True (1): so does every path, where the bytes
    were once copied raw (2 and 255 staged as bools, or read back as 2 and 255)."""
    data = bool_sources()[source]
    want = torch_tensor_bytes(data, dtype)
    shape = tuple(data.shape)

    def same(got, path):
        assert tuple(got.shape) == shape and got.dtype == dtype, (path, got.shape, got.dtype)
        got_bytes = got.cpu().contiguous().view(torch.uint8)
        assert got_bytes.tolist() == want.tolist(), "%s: bytes %s, torch.tensor gives %s" % (
            path,
            got_bytes.tolist(),
            want.tolist(),
        )

    same(pinstage.stage_to_device(data, dtype, device=device), "stage_to_device")
    same(pinstage.stage_many([([3], torch.int64), (data, dtype)], device=device)[1], "stage_many")
    out = torch.zeros(shape, dtype=dtype, device=device)
    pinstage.stage_into(data, out)
    same(out, "stage_into")
    inputs = pinstage.StaticInputs({"f": pinstage.Field(dtype, shape[1:])}, max_bs=shape[0] + 1, device=device)
    inputs.stage({"f": data}, shape[0])
    same(inputs["f"][: shape[0]], "StaticInputs")
