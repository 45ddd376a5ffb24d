"""Conversion semantics on the CPU: pinstage's result is torch.tensor(data, dtype=dtype), bit for bit.

The oracle is always torch.tensor itself (staging_reference.expected); these tests only choose inputs.
They run on every machine, with device="cpu".
"""

import array
import enum
import gc
import traceback
import unittest.mock
import weakref

import numpy as np
import pytest
import torch
from staging_reference import (
    ARRAY_CODE_OF,
    DOUBLE_ROUNDING_CASES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    NUMPY_OF,
    SPECIAL_FLOATS,
    assert_error_names,
    assert_matches_reference,
    assert_same_tensor,
    dtype_name,
    expected,
    int_bounds,
    natural_values,
    safe_float_values,
    seeded_rng,
    small_ints,
)

import pinstage

SIZES = [0, 1, 7, 256, 4097]
# Building numpy inputs from out-of-range doubles (inf by design) makes numpy warn.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
DTYPE_IDS = [dtype_name(d) for d in DTYPES]


def stage_cpu(data, dtype):
    out = pinstage.stage_to_device(data, dtype, device="cpu")
    assert isinstance(out, torch.Tensor)
    assert out.device.type == "cpu", "device='cpu' gave a tensor on %s" % out.device
    return out


def check(data, dtype, what=""):
    return assert_matches_reference(stage_cpu, data, dtype, what or "%s <- %r" % (dtype_name(dtype), _short(data)))


def _short(data):
    text = repr(data)
    return text if len(text) < 120 else text[:117] + "..."


# ---------------------------------------------------------------------------------------------
# The sweep: every dtype x input kind x size.


def _input(kind, dtype, n, rng):
    """One input of the given kind with n elements (n rows for the nested kinds)."""
    if kind == "list":
        return natural_values(dtype, n, rng)
    if kind == "tuple":
        return tuple(natural_values(dtype, n, rng))
    if kind == "list_of_floats":
        return safe_float_values(dtype, n, rng)
    if kind == "list_of_bools":
        return [rng.random() < 0.5 for _ in range(n)]
    if kind == "mixed_int_bool_float":
        pool = [True, False, 0, 1, 7, 100]
        if dtype.is_floating_point:
            pool += [2.5, -0.0, float("nan"), 1e-3]
        return [rng.choice(pool) for _ in range(n)]
    if kind == "nested_2d":
        return [natural_values(dtype, 3, rng) for _ in range(n)]
    if kind == "nested_3d":
        return [[natural_values(dtype, 2, rng) for _ in range(n)] for _ in range(2)]
    if kind == "tuple_of_lists":
        return tuple([v, v] for v in natural_values(dtype, n, rng))
    if kind == "numpy_same_dtype":
        vals = natural_values(dtype, n, rng)
        if dtype == torch.bfloat16:
            return np.array(vals, dtype=np.float32)
        return np.array(vals, dtype=NUMPY_OF[dtype])
    if kind == "numpy_float64":
        vals = safe_float_values(dtype, n, rng) if dtype.is_floating_point else small_ints(n, rng)
        return np.array(vals, dtype=np.float64)
    if kind == "numpy_int64":
        return np.array(small_ints(n, rng), dtype=np.int64)
    if kind == "numpy_strided":
        vals = natural_values(dtype, 2 * n, rng)
        base = np.array(vals, dtype=np.float32 if dtype == torch.bfloat16 else NUMPY_OF[dtype])
        return base[::2]
    if kind == "list_of_numpy_scalars":
        np_type = np.float64 if dtype == torch.bfloat16 else NUMPY_OF[dtype]
        if dtype == torch.uint64:
            # torch.tensor rejects numpy unsigned scalars for uint64; that case is in the error tests.
            np_type = np.int64
            return [np_type(v) for v in small_ints(n, rng)]
        return [np_type(v) for v in natural_values(dtype, n, rng)]
    if kind == "array_array":
        code = ARRAY_CODE_OF.get(dtype)
        if code is None:
            return array.array("d", [float(v) for v in natural_values(dtype, n, rng)])
        if dtype == torch.float32:
            return array.array(code, safe_float_values(dtype, n, rng))
        return array.array(code, natural_values(dtype, n, rng))
    if kind == "tensor_same_dtype":
        return torch.tensor(natural_values(dtype, n, rng), dtype=dtype)
    if kind == "tensor_noncontiguous":
        base = torch.tensor(natural_values(dtype, 3 * n, rng), dtype=dtype).reshape(n, 3)
        return base.t()
    if kind == "tensor_float64":
        return torch.tensor(
            safe_float_values(dtype, n, rng) if dtype.is_floating_point else small_ints(n, rng), dtype=torch.float64
        )
    raise AssertionError(kind)


KINDS = [
    "list",
    "tuple",
    "list_of_floats",
    "list_of_bools",
    "mixed_int_bool_float",
    "nested_2d",
    "nested_3d",
    "tuple_of_lists",
    "numpy_same_dtype",
    "numpy_float64",
    "numpy_int64",
    "numpy_strided",
    "list_of_numpy_scalars",
    "array_array",
    "tensor_same_dtype",
    "tensor_noncontiguous",
    "tensor_float64",
]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matches_torch_tensor(dtype, kind, n):
    rng = seeded_rng(dtype_name(dtype), kind, n)
    data = _input(kind, dtype, n, rng)
    want, want_exc = expected(data, dtype)
    check(data, dtype, "%s %s n=%d" % (dtype_name(dtype), kind, n))
    if kind in ("list", "tuple", "nested_2d", "numpy_same_dtype", "tensor_same_dtype"):
        # These inputs are chosen inside the dtype's range: the sweep must exercise real conversions.
        assert want_exc is None, "input generator produced an input torch.tensor rejects: %r" % want_exc


# ---------------------------------------------------------------------------------------------
# Edge values, one dtype at a time; each input is checked alone so a failure names it.


def _edge_ints(dtype):
    lo, hi = int_bounds(torch.int64 if dtype in (torch.bool,) + tuple(FLOAT_DTYPES) else dtype)
    vals = {
        0,
        1,
        -1,
        lo,
        hi,
        lo + 1,
        hi - 1,
        hi + 1,
        lo - 1,
        127,
        128,
        -128,
        -129,
        255,
        256,
        -256,
        32767,
        32768,
        -32769,
        65535,
        65536,
        2**31 - 1,
        2**31,
        -(2**31) - 1,
        2**32 - 1,
        2**32,
        2**53 + 1,
        2**63 - 1,
        2**63,
        -(2**63),
        2**64 - 1,
        2**64,
        -(2**40),
        2**100,
    }
    return sorted(vals)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_int_edges(dtype):
    for v in _edge_ints(dtype):
        check([v], dtype)
        check([0, v, 1], dtype)
        check(v, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ints_at_the_one_digit_boundary(dtype):
    # Ints below 2^30 in magnitude are read from their one digit in line; the rest by CPython's
    # conversion. Fresh objects (not the cached small ints), zeros made by arithmetic included.
    big = int("1" * 40)
    values = [0, 1, -1, 2**30 - 1, -(2**30 - 1), 2**30, -(2**30), 2**30 + 1, 2**60, -(2**60)]
    fresh = [int(str(v)) for v in values] + [v * 1 for v in values] + [big - big, -(big - big)]
    check(fresh, dtype)
    for v in fresh:
        check([7, v, 7], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_negative_ints(dtype):
    for v in [-1, -2, -100, -127, -128, -129, -255, -256, -257, -32768, -65535, -65536, -(2**31), -(2**32)]:
        check([v], dtype)
        check([5, v], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_float_values(dtype):
    values = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        0.99999,
        1.0,
        1.5,
        1.7,
        -1.7,
        2.5,
        -2.5,
        2.7,
        -2.7,
        126.9,
        127.5,
        128.0,
        255.9,
        256.0,
        -128.9,
        -129.0,
        65535.5,
        2.0**31,
        2.0**31 - 0.5,
        2.0**32,
        2.0**53,
        2.0**63,
        -(2.0**63),
        2.0**64,
        1e20,
        -1e20,
        1e300,
        1e-300,
        5e-324,
    ]
    for v in values + SPECIAL_FLOATS:
        check([v], dtype)
        check([1, v], dtype)
        check(v, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bools(dtype):
    check([True, False, True], dtype)
    check(True, dtype)
    check(False, dtype)
    check([[True], [False]], dtype)
    check([True, 2, False, 0], dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=dtype_name)
def test_half_rounding_of_doubles(dtype):
    rng = seeded_rng("rounding", dtype_name(dtype))
    values = list(DOUBLE_ROUNDING_CASES)
    values += [rng.uniform(-70000, 70000) for _ in range(2000)]
    values += [rng.gauss(0, 1) * 10.0 ** rng.randint(-42, 39) for _ in range(2000)]
    # Exact midpoints and their neighbours between adjacent representable values.
    for m in range(1, 200):
        base = 1.0 + m * 2.0**-10
        values += [base + 2.0**-11, base + 2.0**-11 + 2.0**-45, base + 2.0**-11 - 2.0**-45]
        base = 1.0 + m * 2.0**-7
        values += [base + 2.0**-8, base + 2.0**-8 + 2.0**-45, base + 2.0**-8 - 2.0**-45]
    check(values, dtype)
    for v in DOUBLE_ROUNDING_CASES:
        check([v], dtype)


def test_uint64_above_int64():
    vals = [2**63, 2**63 + 1, 2**64 - 1, 2**64 - 2, 2**63 - 1, 0, 12345678901234567890]
    check(vals, torch.uint64)
    rng = seeded_rng("u64")
    check([rng.randint(2**63, 2**64 - 1) for _ in range(1000)], torch.uint64)
    check(2**64 - 1, torch.uint64)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nested_shapes(dtype):
    rng = seeded_rng("nested", dtype_name(dtype))
    v = lambda k: natural_values(dtype, k, rng)  # noqa: E731
    cases = [
        [v(3), v(3)],
        [v(1)],
        [[v(2), v(2), v(2)], [v(2), v(2), v(2)]],
        [[[v(2)]], [[v(2)]]],
        tuple(tuple(v(4)) for _ in range(3)),
        [tuple(v(2)), v(2)],
        [[], []],
        [[]],
        [[[]]],
        [[[], []], [[], []]],
        [],
        (),
        [[v(1)[0]] for _ in range(50)],
    ]
    for data in cases:
        exc = check(data, dtype)
        assert exc is None, "torch.tensor rejected a rectangular input: %r" % exc


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_inputs(dtype):
    for data in (
        [],
        (),
        [[]],
        [[], [], []],
        range(0),
        range(5, 5),
        range(5, 0),
        np.zeros((0,), dtype=np.int64),
        np.zeros((3, 0), dtype=np.float32),
        torch.zeros(0, 2),
        array.array("q"),
    ):
        want, exc = expected(data, dtype)
        assert exc is None
        got = stage_cpu(data, dtype)
        assert got.numel() == 0
        assert_same_tensor(got, want, "empty %r" % (data,))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ranges(dtype):
    for r in [
        range(10),
        range(1),
        range(0),
        range(10, -10, -3),
        range(-5, 5),
        range(100, 0, -1),
        range(0, 300, 7),
        range(250, 260),
        range(0, 2**40, 2**37),
        range(2**63 - 3, 2**63 + 2),
        range(-(2**63), -(2**63) + 3),
        range(0, 4097),
    ]:
        check(r, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_scalars(dtype):
    for s in [
        0,
        1,
        -1,
        7,
        255,
        2**40,
        3.5,
        -2.25,
        float("nan"),
        float("inf"),
        True,
        False,
        np.int8(-3),
        np.uint8(200),
        np.int16(-300),
        np.int32(70000),
        np.int64(-(2**40)),
        np.uint16(60000),
        np.uint32(2**32 - 1),
        np.uint64(2**64 - 1),
        np.float16(1.5),
        np.float32(-2.75),
        np.float64(1e-3),
        np.bool_(True),
        np.array(5),
        np.array(2.5),
        torch.tensor(3),
        torch.tensor(1.25),
        torch.tensor(True),
    ]:
        check(s, dtype)


NUMPY_TYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_numpy_arrays_of_every_dtype(dtype):
    rng = seeded_rng("np", dtype_name(dtype))
    for np_type in NUMPY_TYPES:
        arr = np.array(small_ints(37, rng), dtype=np_type)
        check(arr, dtype)
        check(arr.reshape(37, 1), dtype)
        check(np.asfortranarray(np.array(small_ints(12, rng), dtype=np_type).reshape(3, 4)), dtype)
        check(arr[::3], dtype)
        check(arr[5:6], dtype)
    # Same-dtype arrays over the full range (no cross-type cast, so any value is defined).
    if dtype != torch.bfloat16:
        check(np.array(natural_values(dtype, 1000, rng), dtype=NUMPY_OF[dtype]), dtype)
    # Signed to unsigned and wide to narrow integer casts are defined (modular) for numpy arrays.
    if dtype in INT_DTYPES:
        check(np.array([rng.randint(-(2**63), 2**63 - 1) for _ in range(500)], dtype=np.int64), dtype)
    if dtype in FLOAT_DTYPES:
        check(np.array([rng.gauss(0, 1) * 10.0 ** rng.randint(-40, 40) for _ in range(500)] + SPECIAL_FLOATS), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_lists_of_numpy_scalars(dtype):
    check([np.int64(1), np.int64(2), np.int64(-3)], dtype)
    check([np.int32(7), 8, np.uint8(9)], dtype)
    check([np.float32(1.5), np.float64(-0.25), np.float16(2.0)], dtype)
    check([np.float64("nan"), np.float64("inf")], dtype)
    check([np.bool_(True), np.bool_(False)], dtype)
    check([np.uint64(5), np.uint64(2**64 - 1)], dtype)
    check([[np.int16(1), np.int16(2)], [np.int16(3), np.int16(4)]], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_buffers(dtype):
    rng = seeded_rng("buf", dtype_name(dtype))
    for code in ["b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d"]:
        check(array.array(code, small_ints(33, rng)), dtype)
    check(array.array("q", [-1, -2, 2**40]), dtype)
    check(array.array("Q", [2**64 - 1, 2**63]), dtype)
    check(array.array("d", [1.5, -2.7, 1e20, float("nan")]), dtype)
    check(bytearray(b"\x00\x01\xff\x80"), dtype)
    check(memoryview(array.array("i", [1, -2, 3])), dtype)
    check(memoryview(bytearray(b"\x05\x06")), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_numpy_scalars_and_zero_dim_arrays(dtype):
    for np_type in NUMPY_TYPES:
        if np_type is np.bool_:
            values = [True, False]
        elif np.issubdtype(np_type, np.integer):
            info = np.iinfo(np_type)
            values = [info.min, info.max, 0, 1]
        else:
            values = [1.5, -0.0, float("nan"), float("inf"), float(np.finfo(np_type).max)]
        for v in values:
            check(np_type(v), dtype)
            check(np.array(v, dtype=np_type), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_buffers_torch_refuses_or_reads_elementwise(dtype):
    rng = seeded_rng("odd-buffers", dtype_name(dtype))
    arr = np.array(small_ints(24, rng), dtype=np.int32)
    check(arr[::-1], dtype)  # negative strides: torch.from_numpy refuses
    check(arr.reshape(4, 6)[:, ::-2], dtype)
    check(arr.astype(">i4"), dtype)  # the other byte order
    check(np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), dtype)  # structured
    check(np.array([1, 2], dtype=object), dtype)
    check(memoryview(arr)[::2], dtype)  # strided sequence
    check(memoryview(arr)[::-1], dtype)
    check(memoryview(arr.reshape(4, 6)), dtype)  # torch cannot read a 2-D memoryview
    check(memoryview(np.array([1.5, 2.5], dtype=np.float16)), dtype)  # nor one of halves
    check(memoryview(np.array([True, False])), dtype)
    check(b"\x01\x02", dtype)  # torch refuses bytes
    check(array.array("d", [0.5, -1.5, 2**70, -(2**70)]), dtype)


@pytest.mark.parametrize("np_type", [np.int8, np.int16, np.float32, np.int64, np.float64, np.bool_, np.uint16])
def test_strided_arrays_of_the_requested_type_are_gathered_in_row_major_order(np_type):
    """A strided numpy array of the requested element type is gathered in C++ (not by torch's copy
    kernel): every layout must give torch.tensor's values, in its order, without a fallback."""
    a = (np.random.default_rng(7).random((7, 6, 5, 4)) * 100).astype(np_type)
    dtype = torch.from_numpy(a).dtype
    before = _fallbacks()
    for view in (
        a[:, 0],
        a[::2],
        a[:, ::3, 1],
        a.transpose(3, 1, 0, 2),
        a[..., 0][::2, ::2],
        a[:, :, :, 0:1],
        np.broadcast_to(a[0, 0, 0], (3, 4)),
        a[2:4, 0, 0],
        a[:, 1:4][:, :, ::2],
    ):
        assert not view.flags["C_CONTIGUOUS"]
        check(view, dtype, what=f"shape {view.shape} strides {view.strides}")
    assert _fallbacks() == before


def _fallbacks():
    return pinstage.stats(device="cpu")["fallbacks"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_arrays_buffers_and_tensors_take_no_fallback(dtype):
    """numpy arrays (any element type, strided or not), array.array and memoryview of the same type,
    and CPU tensors are copied or cast in C++, never converted by torch.tensor."""
    rng = seeded_rng("no-fallback", dtype_name(dtype))
    inputs = []
    for np_type in NUMPY_TYPES:
        arr = np.array(small_ints(40, rng), dtype=np_type)
        inputs += [arr, arr[::3], arr.reshape(5, 8).T, arr[7:8].reshape(())]
    if dtype in ARRAY_CODE_OF:
        a = array.array(ARRAY_CODE_OF[dtype], small_ints(9, rng))
        inputs += [a, memoryview(a)]
    for src in (torch.int64, torch.float16, torch.bool, dtype):
        t = torch.tensor(small_ints(30, rng), dtype=src)
        inputs += [t, t.view(5, 6).t(), t[::2]]
    if dtype == torch.uint8:
        inputs.append(bytearray(b"\x00\x07\xff"))
    for data in inputs:
        before = _fallbacks()
        want, exc = expected(data, dtype)
        assert exc is None, exc
        got = stage_cpu(data, dtype)
        assert_same_tensor(got, want, "%s <- %r" % (dtype_name(dtype), _short(data)))
        assert _fallbacks() == before, "took the torch.tensor fallback for %r" % (_short(data),)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cpu_tensors(dtype):
    rng = seeded_rng("tensor", dtype_name(dtype))
    for src in DTYPES:  # every source dtype into every target
        t = torch.tensor(small_ints(60, rng), dtype=src)
        check(t, dtype)
        check(t.reshape(6, 10).t(), dtype)
        check(t.reshape(3, 4, 5).permute(2, 0, 1), dtype)
        check(t[::4], dtype)
        check(t[7], dtype)
        check(t.reshape(6, 10)[1:5, 2:9:3], dtype)
        check(t.expand(1, 60).expand(4, 60), dtype)
    for complex_dtype in (torch.complex64, torch.complex128):  # negative views: their values are negated
        imag = torch.tensor([1 + 2j, -3.5 - 0.25j, 0.5j], dtype=complex_dtype).conj().imag
        for view in (imag, imag[::2], imag[1]):
            assert view.is_neg()
            check(view, dtype)
    same = torch.tensor(natural_values(dtype, 500, rng), dtype=dtype)
    check(same, dtype)
    check(same[1::2], dtype)
    check([torch.tensor(1), torch.tensor(2)], dtype)
    check([torch.tensor(1.5), 2], dtype)
    # The result must not alias a CPU tensor passed in (torch.tensor copies).
    src = torch.tensor(small_ints(10, rng), dtype=dtype)
    assert any(src.tolist())
    got = stage_cpu(src, dtype)
    before = got.clone()
    src.fill_(0)
    assert torch.equal(got, before), "result aliases the input tensor"


class Colour(enum.IntEnum):
    RED = 1
    GREEN = 2


class Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class Real:
    def __init__(self, v):
        self.v = v

    def __float__(self):
        return self.v


class MyInt(int):
    pass


class MyFloat(float):
    pass


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_python_number_like_objects(dtype):
    """Inputs outside any fast path still give torch.tensor's answer (exact fallback)."""
    check([Colour.RED, Colour.GREEN], dtype)
    check([MyInt(5), MyInt(-1)], dtype)
    check([MyFloat(1.25), 3], dtype)
    check([Index(3), Index(4)], dtype)
    check([Real(3.5)], dtype)
    check([1, Colour.GREEN, 2.0], dtype)


# ---------------------------------------------------------------------------------------------
# Errors: same exception type as torch.tensor; element errors name index, value and dtype.

# (data, dtype, index of the offending element or None for a scalar, offending value)
ELEMENT_ERRORS = [
    ([1, 300], torch.uint8, (1,), 300),
    ([5, 128], torch.int8, (1,), 128),
    ([0, 0, -129, 4], torch.int8, (2,), -129),
    ([0, 2**31], torch.int32, (1,), 2**31),
    ([7, 65536], torch.uint16, (1,), 65536),
    ([7, 2**32], torch.uint32, (1,), 2**32),
    ([0, 0, 2**63], torch.int64, (2,), 2**63),
    ([1, -1], torch.uint64, (1,), -1),
    ([2**64], torch.uint64, (0,), 2**64),
    ([3, 1.5], torch.uint64, (1,), 1.5),
    ([1, float("nan")], torch.int32, (1,), float("nan")),
    ([float("inf")], torch.int64, (0,), float("inf")),
    ([2, float("-inf")], torch.int16, (1,), float("-inf")),
    ([1, 2, 1e20], torch.int64, (2,), 1e20),
    ([1.7, -2.7], torch.uint8, (1,), -2.7),
    ([-(2**40)], torch.uint8, (0,), -(2**40)),
    ([[1, 2], [3, 300]], torch.uint8, (1, 1), 300),
    ([[[1, 2]], [[3, 2**70]]], torch.int64, (1, 0, 1), 2**70),
    ([1, None], torch.float32, (1,), None),
    ([None], torch.int64, (0,), None),
    ([1, 2j], torch.float64, (1,), 2j),
    ([1, 2j], torch.int32, (1,), 2j),
    ([0, np.float32(-1.0)], torch.uint8, (1,), np.float32(-1.0)),
    ([np.int64(3)], torch.uint64, (0,), np.int64(3)),
    ([1, 2, np.uint64(2**64 - 1)], torch.int64, (2,), np.uint64(2**64 - 1)),
    ([[1, 2], 3], torch.int64, (1,), 3),  # a level of sequences and scalars: the item of the other kind
    ([1, [2]], torch.int64, (1,), [2]),
    ([[1, 2], [3, [4]]], torch.int64, (1, 1), [4]),
    (300, torch.uint8, None, 300),
    (2**64, torch.uint64, None, 2**64),
    (float("nan"), torch.int64, None, float("nan")),
]


@pytest.mark.parametrize(
    "data,dtype,index,value",
    ELEMENT_ERRORS,
    ids=["%s-%d" % (dtype_name(e[1]), i) for i, e in enumerate(ELEMENT_ERRORS)],
)
def test_element_errors_name_index_value_dtype(data, dtype, index, value):
    want, want_exc = expected(data, dtype)
    assert want_exc is not None, "torch.tensor accepts %r as %s; the case list is stale" % (data, dtype)
    exc = check(data, dtype)
    assert_error_names(exc, index, value, dtype)


def test_error_example_from_the_contract():
    with pytest.raises(RuntimeError) as info:
        pinstage.stage_to_device([1, 300], torch.uint8, device="cpu")
    message = str(info.value)
    assert "[1]" in message and "300" in message and "uint8" in message, message


# Factories, so that one-shot inputs (generators) are fresh for each call.
STRUCTURAL_ERRORS = [
    lambda: [[1, 2], [3]],
    lambda: [[1], [2, 3]],
    lambda: [[[1, 2]], [[3]]],
    lambda: [[1, 2], 3],
    lambda: [1, [2]],
    lambda: "abc",
    lambda: ["a"],
    lambda: [1, "a"],
    lambda: [[1, "a"]],
    lambda: b"ab",
    lambda: {1: 2},
    lambda: {1, 2},
    lambda: None,
    lambda: (i for i in range(3)),
    lambda: [torch.tensor([1, 2]), torch.tensor([3, 4])],
    lambda: np.arange(10)[::-1],
    lambda: np.array([1, 2], dtype=">i4"),
    lambda: np.array([1, "a"], dtype=object),
    lambda: memoryview(np.arange(6, dtype=np.int32).reshape(2, 3)),
    # numpy scalars whose buffer shows bytes, not a number (datetime64's leaves out its strides)
    lambda: np.timedelta64(1, "s"),
    lambda: np.datetime64("2020-01-01"),
    lambda: np.datetime64("NaT"),
    lambda: [np.timedelta64(1, "s")],
    lambda: np.bytes_(b"ab"),
    # torch refuses numpy's ulonglong arrays (uint64 is 'L' where long is 64 bits), not its scalars
    lambda: np.array([1, 2], dtype=np.ulonglong),
    lambda: np.array(5, dtype=np.ulonglong),
    lambda: np.ulonglong(5),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", range(len(STRUCTURAL_ERRORS)))
def test_structural_errors_same_type(case, dtype):
    make = STRUCTURAL_ERRORS[case]
    want, want_exc = expected(make(), dtype)
    if want_exc is None:
        assert_same_tensor(stage_cpu(make(), dtype), want, "structural case %d" % case)
        return
    with pytest.raises(type(want_exc)):
        stage_cpu(make(), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_torch_error_has_same_type(dtype):
    """Broad sweep of values that torch.tensor rejects for some dtype; the type must always match."""
    values = _edge_ints(dtype) + [1.5, -1.5, float("nan"), float("inf"), 1e300, None, 1j, "x", [1]]
    for v in values:
        for data in ([v], [0, v], [[0, 1], [2, v]]):
            check(data, dtype)


UNSUPPORTED = [torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.quint8, torch.qint8]


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=dtype_name)
def test_unsupported_dtype_raises_type_error(dtype):
    for data in ([1, 2, 3], [], 5, np.arange(3)):
        with pytest.raises(TypeError) as info:
            pinstage.stage_to_device(data, dtype, device="cpu")
        assert dtype_name(dtype) in str(info.value), str(info.value)
    with pytest.raises(TypeError) as info:
        pinstage.stage_many([([1], torch.int64), ([1], dtype)], device="cpu")
    assert dtype_name(dtype) in str(info.value), str(info.value)


def test_failed_call_does_not_disturb_later_calls():
    first = stage_cpu([1, 2, 3], torch.int64)
    with pytest.raises(RuntimeError):
        stage_cpu(list(range(250)) + [300] + list(range(250)), torch.uint8)
    with pytest.raises(TypeError):
        stage_cpu([1.0, None], torch.float32)
    with pytest.raises(ValueError):
        stage_cpu([[1, 2], [3]], torch.int32)
    assert torch.equal(first, torch.tensor([1, 2, 3]))
    check(list(range(500)), torch.int16)


# ---------------------------------------------------------------------------------------------
# stage_many and stage_into on the CPU.


def test_stage_many_cpu():
    rng = seeded_rng("many")
    items = [(natural_values(d, n, rng), d) for d, n in zip(DTYPES, [3, 0, 7, 1, 256, 5, 9, 17, 31, 4, 6, 1000, 2])]
    items.append(([[1, 2, 3], [4, 5, 6]], torch.int32))
    items.append((np.arange(10, dtype=np.float32), torch.float64))
    items.append((range(5), torch.int64))
    items.append((7, torch.float32))
    out = pinstage.stage_many(items, device="cpu")
    assert isinstance(out, list) and len(out) == len(items)
    for i, ((data, dtype), got) in enumerate(zip(items, out)):
        want, exc = expected(data, dtype)
        assert exc is None
        assert got.device.type == "cpu"
        assert_same_tensor(got, want, "stage_many item %d" % i)
    assert pinstage.stage_many([], device="cpu") == []


def test_stage_many_cpu_error_matches_torch():
    with pytest.raises(RuntimeError) as info:
        pinstage.stage_many([([1, 2], torch.int64), ([1, 300], torch.uint8)], device="cpu")
    assert "300" in str(info.value) and "uint8" in str(info.value), str(info.value)
    with pytest.raises(ValueError):
        pinstage.stage_many([([[1, 2], [3]], torch.int64)], device="cpu")


class TwoArgumentError(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)


class IndexRaisingTwoArgumentError:
    def __index__(self):
        raise TwoArgumentError(1, 2)


def test_an_error_that_cannot_be_made_from_a_message_is_raised_as_it_was():
    """stage_many names the failing element and item by making its error again with a prefixed
    message; an exception class whose __init__ takes other arguments keeps its own instance, and
    each location is a note (PEP 678) instead."""
    data = [IndexRaisingTwoArgumentError()]
    assert isinstance(expected(data, torch.int64)[1], TwoArgumentError)
    with pytest.raises(TwoArgumentError) as info:
        pinstage.stage_many([([1], torch.int64), (data, torch.int64)], device="cpu")
    assert info.value.args == (1, 2)
    element, item = info.value.__notes__
    assert element.startswith("pinstage: element [0] = <") and element.endswith("cannot be converted to torch.int64")
    assert item == "pinstage.stage_many: item 1"


class NotRemadeError(ValueError):
    """An error whose class, called with pinstage's longer message, gives back something else."""

    def __new__(cls, message):
        if message.startswith("pinstage"):
            return SELF_NAMED[cls.__name__]  # not an instance of BaseException
        return super().__new__(cls, message)


class MockRemadeError(ValueError):
    """An error whose class, called with pinstage's longer message, gives back an object that passes
    isinstance(made, ValueError) but is no exception."""

    def __new__(cls, message):
        if message.startswith("pinstage"):
            return unittest.mock.Mock(spec=ValueError)
        return super().__new__(cls, message)


class NoTracebackError(ValueError):
    """An error whose with_traceback gives back no exception."""

    def with_traceback(self, tb):
        return None


class FrozenError(ValueError):
    """An error whose attributes cannot be set (a cause or context copied onto it raises)."""

    def __setattr__(self, name, value):
        raise AttributeError(f"frozen: {name}")


class OtherClassError(ValueError):
    """An error whose class, called with pinstage's longer message, makes an error of another class."""

    def __new__(cls, message):
        if message.startswith("pinstage"):
            return KeyError(message)
        return super().__new__(cls, message)


SELF_NAMED = {"NotRemadeError": "a str, not an error"}


class RaisingIndex:
    def __init__(self, error_class):
        self.error_class = error_class

    def __index__(self):
        raise self.error_class("bad")


class InterruptedRemakeError(ValueError):
    """An error whose class, called with pinstage's longer message, is interrupted (as a signal
    handler's KeyboardInterrupt would interrupt any Python code run then)."""

    def __init__(self, message):
        if message.startswith("pinstage"):
            raise KeyboardInterrupt("while re-making")
        super().__init__(message)


# Where a conversion's error is re-made: the fallback (torch.tensor's conversion, in Python), the
# fallback and then the core (stage_many's item), and the core alone (a row index read in C++).
REMAKERS = ["stage_to_device", "stage_many", "write_rows"]


def raise_through(api, error_class):
    data = [RaisingIndex(error_class)]
    if api == "stage_many":
        pinstage.stage_many([(data, torch.int64)], device="cpu")
    elif api == "write_rows":
        inputs = pinstage.StaticInputs({"a": pinstage.Field(torch.int64, (4,))}, max_bs=4, device="cpu")
        inputs.write_rows("a", data, [0], [[1]])
    else:
        pinstage.stage_to_device(data, torch.int64, device="cpu")


@pytest.mark.parametrize("error_class", [NotRemadeError, MockRemadeError, NoTracebackError, FrozenError])
@pytest.mark.parametrize("api", REMAKERS)
def test_an_error_class_that_makes_no_error_from_the_message_is_raised_as_it_was(api, error_class):
    """Where re-making the error gives no exception, or the copy cannot be completed, the original is
    raised, each location a note."""
    with pytest.raises(error_class) as info:
        raise_through(api, error_class)
    assert info.value.args == ("bad",)
    if error_class is FrozenError:
        assert not hasattr(info.value, "__notes__"), "nor does it take a note"
        return
    notes = info.value.__notes__
    if api == "write_rows":
        assert notes == ["pinstage.StaticInputs.write_rows: field 'a': write 0"]
        return
    assert notes[0].startswith("pinstage: element [0] = <") and notes[0].endswith("to torch.int64")
    assert notes[1:] == (["pinstage.stage_many: item 0"] if api == "stage_many" else [])


@pytest.mark.parametrize("api", REMAKERS)
def test_an_error_class_that_makes_another_class_from_the_message_raises_that_class(api):
    """What the error's class made of the longer message is raised, with that object's own type."""
    with pytest.raises(KeyError, match="element" if api == "stage_to_device" else "pinstage[.]") as info:
        raise_through(api, OtherClassError)
    assert type(info.value) is KeyError


@pytest.mark.parametrize("api", REMAKERS)
def test_an_interrupt_while_an_error_is_remade_is_raised_not_lost(api):
    """A KeyboardInterrupt raised by Python code that runs while an error is re-made reaches the
    caller, the original error its context."""
    with pytest.raises(KeyboardInterrupt) as info:
        raise_through(api, InterruptedRemakeError)
    assert info.value.args == ("while re-making",), "an interrupt is not re-made"
    original = info.value.__context__
    assert type(original) is InterruptedRemakeError
    lines = [frame.line for frame in traceback.extract_tb(original.__traceback__)]
    assert 'raise self.error_class("bad")' in lines, "the original keeps its traceback"


@pytest.mark.parametrize("api", REMAKERS)
def test_an_interrupt_from_a_conversion_goes_on_as_raised(api):
    """Only errors (Exception) are re-made with a location: a KeyboardInterrupt raised by a value's
    own code reaches the caller as it was raised."""
    with pytest.raises(KeyboardInterrupt) as info:
        raise_through(api, lambda message: KeyboardInterrupt(message))
    assert info.value.args == ("bad",) and not hasattr(info.value, "__notes__")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_stage_into_cpu(dtype):
    rng = seeded_rng("into", dtype_name(dtype))
    data = natural_values(dtype, 50, rng)
    out = torch.empty(50, dtype=dtype)
    got = pinstage.stage_into(data, out)
    assert got is out, "stage_into returns the tensor it filled"
    assert_same_tensor(out, torch.tensor(data, dtype=dtype), "stage_into")
    data2 = [natural_values(dtype, 4, rng) for _ in range(3)]
    out2 = torch.empty(3, 4, dtype=dtype)
    pinstage.stage_into(data2, out2)
    assert_same_tensor(out2, torch.tensor(data2, dtype=dtype), "stage_into 2-D")


def test_stage_into_cpu_mismatch_errors():
    out = torch.full((4,), 7, dtype=torch.int64)
    with pytest.raises(ValueError):
        pinstage.stage_into([1, 2, 3], out)
    with pytest.raises(ValueError):
        pinstage.stage_into([1, 2, 3, 4, 5], out)
    with pytest.raises(TypeError) as info:
        pinstage.stage_into([1.0, 2.0, 3.0, 4.0], torch.empty(4, dtype=torch.complex64))
    assert "complex64" in str(info.value), str(info.value)
    with pytest.raises(RuntimeError):
        pinstage.stage_into([1, 2, 3, 300], torch.zeros(4, dtype=torch.uint8))
    assert torch.equal(out, torch.full((4,), 7, dtype=torch.int64)), "a failed stage_into wrote into out"


def test_device_strings_are_each_parsed_for_what_they_say():
    """Each call gets its own string's device, and a bad string raises without spoiling the next call."""
    cpu_text = "".join(["c", "p", "u"])  # a str object of its own, not the interned literal
    for device in ("cpu", cpu_text, "cpu", torch.device("cpu")):
        got = pinstage.stage_to_device([1, 2], torch.int64, device=device)
        assert got.device.type == "cpu" and torch.equal(got, torch.tensor([1, 2]))
    for bad in ("tpu", "cuda:x", "cpu:abc"):
        with pytest.raises(RuntimeError):
            pinstage.stage_to_device([1], torch.int64, device=bad)
        with pytest.raises(RuntimeError):
            pinstage.stage_to_device([1], torch.int64, device=bad)  # not remembered as good
        assert pinstage.stage_to_device([3], torch.int64, device="cpu").tolist() == [3]
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            pinstage.stage_to_device([1], torch.int64, device="cuda")


def test_a_device_string_whose_release_stages_does_not_confuse_the_next_call():
    """A str subclass whose __del__ stages (re-entering the device parser) must not confuse later calls."""

    class Reentrant(str):
        def __del__(self):
            pinstage.stage_to_device([1], torch.int64, device="cpu")

    pinstage.stage_to_device([1], torch.int64, device=Reentrant("cpu"))
    other = "cuda:0" if torch.cuda.is_available() else "cuda"
    try:
        pinstage.stage_to_device([1], torch.int64, device=other)
    except RuntimeError:
        assert not torch.cuda.is_available()
    gc.collect()
    got = pinstage.stage_to_device([1], torch.int64, device="cpu")
    assert got.device.type == "cpu"
    assert pinstage.stage_to_device([1], torch.int64, device=Reentrant("cpu")).device.type == "cpu"


@pytest.mark.no_gpu  # checks the default device where no GPU is visible
def test_default_device_without_cuda_is_cpu():
    got = pinstage.stage_to_device([1, 2, 3], torch.int64)
    assert got.device.type == "cpu"
    assert not got.is_pinned()
    assert torch.equal(got, torch.tensor([1, 2, 3]))
    many = pinstage.stage_many([([1], torch.int32), ([2.5], torch.float32)])
    assert [t.device.type for t in many] == ["cpu", "cpu"]


class ChainedIndexError:
    """An __index__ whose error has a cause, a context and a note, as `raise ... from ...` in a
    user's conversion makes it."""

    def __index__(self):
        try:
            raise KeyError("inner")
        except KeyError:
            error = ValueError("outer")
            error.add_note("a note")
            raise error from LookupError("cause")


@pytest.mark.parametrize("api", ["stage_to_device", "stage_many"])
def test_a_prefixed_error_keeps_its_cause_context_and_notes(api):
    """A conversion's error is made again with a message naming the element (and stage_many's item);
    the new error keeps the original's chain, so the traceback shows what the user's code raised from."""
    data = [ChainedIndexError()]
    with pytest.raises(ValueError) as original:
        torch.tensor(data, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"element \[0\]") as info:
        if api == "stage_many":
            pinstage.stage_many([([1], torch.int64), (data, torch.int64)], device="cpu")
        else:
            pinstage.stage_to_device(data, torch.int64, device="cpu")
    got, want = info.value, original.value
    assert type(got.__cause__) is LookupError and got.__cause__.args == ("cause",)
    assert type(got.__context__) is KeyError and got.__context__.args == ("inner",)
    assert got.__suppress_context__ is want.__suppress_context__ is True
    assert got.__notes__ == want.__notes__ == ["a note"]
    got.__notes__.append("mine")
    assert want.__notes__ == ["a note"], "the notes are a copy"
    lines = [frame.line for frame in traceback.extract_tb(got.__traceback__)]
    assert 'raise error from LookupError("cause")' in lines, "the traceback goes down to the line that raised"


class NotesTupleIndexError:
    def __index__(self):
        error = ValueError("outer")
        error.__notes__ = ("not a list",)
        raise error


@pytest.mark.parametrize("api", ["stage_to_device", "stage_many"])
def test_notes_that_are_not_a_list_are_left_behind(api):
    """PEP 678's notes are a list; anything else is not copied (by either path that re-makes errors)."""
    data = [NotesTupleIndexError()]
    with pytest.raises(ValueError, match=r"element \[0\]") as info:
        if api == "stage_many":
            pinstage.stage_many([(data, torch.int64)], device="cpu")
        else:
            pinstage.stage_to_device(data, torch.int64, device="cpu")
    assert not hasattr(info.value, "__notes__")


class PlainIndexError:
    def __index__(self):
        raise ValueError("bad")  # no local holds the error: its frame and it make no cycle


def test_a_refused_element_is_freed_with_its_error():
    """The re-made error and the frame that raised it do not keep each other (and the data) alive:
    without the cycle collector, dropping the error frees the element."""
    element = PlainIndexError()
    alive = weakref.ref(element)
    gc.disable()
    try:
        data = [element]
        del element
        try:
            pinstage.stage_to_device(data, torch.int64, device="cpu")
        except ValueError:
            pass  # dropped here (pytest.raises would keep it)
        else:
            pytest.fail("the element's error was not raised")
        del data
        assert alive() is None, "something still holds the element after its error was dropped"
    finally:
        gc.enable()
