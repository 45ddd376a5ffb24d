"""Property tests: random data of every kind pinstage takes, against torch.tensor itself.

stage_to_device, stage_many and stage_into must give torch.tensor's values, dtype and shape, or raise
its exception type; after any exception the next call works and every earlier result is intact.
Hypothesis runs a fixed number of examples from a fixed seed (derandomize), so CI is deterministic.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from staging_reference import DTYPES, NUMPY_OF, assert_same_tensor, expected, int_bounds
from support import DEVICES

import pinstage

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


class MyInt(int):
    pass


class MyFloat(float):
    pass


class Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v

    def __repr__(self):
        return "Index(%r)" % self.v


class Float:
    def __init__(self, v):
        self.v = v

    def __float__(self):
        return self.v

    def __repr__(self):
        return "Float(%r)" % self.v


def boundary_ints():
    values = {0, 1, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, 2**30, -(2**30), 2**31, 2**53 + 1}
    for dtype in DTYPES:
        if dtype.is_floating_point:
            continue
        lo, hi = int_bounds(dtype)
        values |= {lo, hi, lo - 1, hi + 1}
    return st.sampled_from(sorted(values))


def special_floats():
    return st.sampled_from(
        [
            0.0,
            -0.0,
            math.inf,
            -math.inf,
            math.nan,
            5e-324,
            1.1754943508222875e-38,
            65504.0,
            65520.0,
            1.0 + 2.0**-11 + 2.0**-40,
            3.3895313892515355e38,
            2.0**63,
            -(2.0**63),
            2.0**64,
            1e300,
            0.5,
            255.5,
            -1.5,
        ]
    )


numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    boundary_ints(),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    special_floats(),
    st.booleans(),
)


def element():
    """One element: a Python number, a subclass of one, an __index__ / __float__ object, or a numpy
    scalar of some type."""
    numpy_scalar = st.tuples(st.sampled_from(sorted(set(NUMPY_OF.values()), key=str)), st.integers(0, 100)).map(
        lambda p: p[0](p[1])
    )
    return st.one_of(
        numbers,
        numbers,
        numbers,
        st.integers(-(2**40), 2**40).map(MyInt),
        st.floats(allow_nan=True).map(MyFloat),
        st.integers(-(2**40), 2**40).map(Index),
        st.floats(allow_nan=True).map(Float),
        numpy_scalar,
    )


def nested(depth):
    """Nested lists/tuples of elements, `depth` levels deep: rectangular (torch accepts it) four
    times in five, ragged otherwise."""
    rectangular = st.lists(st.integers(0, 4), min_size=depth, max_size=depth).flatmap(_filled)
    return st.one_of(rectangular, rectangular, rectangular, rectangular, _ragged(depth))


def _filled(shape):
    if not shape:
        return element()
    return st.tuples(st.lists(_filled(shape[1:]), min_size=shape[0], max_size=shape[0]), st.booleans()).map(
        lambda t: tuple(t[0]) if t[1] else list(t[0])
    )


def _ragged(depth):
    """Each list draws its own length, so siblings mostly differ."""
    if depth == 0:
        return element()
    return st.tuples(st.lists(_ragged(depth - 1), max_size=4), st.booleans()).map(
        lambda t: tuple(t[0]) if t[1] else list(t[0])
    )


def numpy_array():
    shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3)
    return st.tuples(
        st.sampled_from(sorted(set(NUMPY_OF.values()), key=str)), shapes, st.integers(0, 2**32 - 1), st.booleans()
    ).map(_make_array)


def _make_array(spec):
    np_type, shape, seed, strided = spec
    rng = np.random.default_rng(seed)
    arr = (
        (rng.standard_normal(shape) * 1000).astype(np_type)
        if np.issubdtype(np_type, np.floating)
        else rng.integers(0, 200, shape).astype(np_type)
    )
    if strided and arr.ndim:
        arr = arr[..., ::2]
    return arr


data_strategy = st.one_of(
    element(),
    nested(1),
    nested(2),
    nested(3),
    numpy_array(),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
    st.lists(st.floats(allow_nan=True), max_size=50),
    st.builds(range, st.integers(-100, 100), st.integers(-100, 300), st.sampled_from([1, 2, 7, -3])),
)
dtype_strategy = st.sampled_from(DTYPES)


def _rectangular_numel(data):
    """The element count of a rectangular structure of lists/tuples (a non-list is one element),
    None when it is ragged."""
    if isinstance(data, (np.ndarray, range)):
        return len(data) if isinstance(data, range) else int(np.size(data))
    if not isinstance(data, (list, tuple)):
        return 1
    shape, level = [], data
    while isinstance(level, (list, tuple)):
        shape.append(len(level))
        if not level:
            break
        level = level[0]

    def fits(x, depth):
        if depth == len(shape):
            return not isinstance(x, (list, tuple)) or shape[-1] == 0
        return isinstance(x, (list, tuple)) and len(x) == shape[depth] and all(fits(y, depth + 1) for y in x)

    return int(np.prod(shape)) if fits(data, 0) else None


class Ledger:
    """Every result staged so far with its expectation: checked again after every exception."""

    def __init__(self, device):
        self.device, self.entries = device, []

    def add(self, got, want):
        self.entries.append((got, want))

    def check(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
        for got, want in self.entries:
            assert_same_tensor(got, want.to(self.device), "an earlier result")


def _expect(data, dtype):
    want, exc = expected(data, dtype)
    return want, exc


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(data=data_strategy, dtype=dtype_strategy)
def test_stage_to_device_is_torch_tensor(device, data, dtype):
    want, exc = _expect(data, dtype)
    if exc is None:
        got = pinstage.stage_to_device(data, dtype, device=device)
        assert got.device.type == device
        assert_same_tensor(got, want.to(device), "%r as %s" % (data, dtype))
        return
    with pytest.raises(type(exc)):
        pinstage.stage_to_device(data, dtype, device=device)
    after = pinstage.stage_to_device([1, 2, 3], torch.int64, device=device)
    assert after.cpu().tolist() == [1, 2, 3]


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(items=st.lists(st.tuples(data_strategy, dtype_strategy), min_size=1, max_size=4))
def test_stage_many_is_torch_tensor_per_item(device, items):
    ledger = Ledger(device)
    expectations = [_expect(d, t) for d, t in items]
    failing = tuple(type(exc) for _, exc in expectations if exc is not None)
    if not failing:
        got = pinstage.stage_many(items, device=device)
        assert len(got) == len(items)
        for g, (want, _) in zip(got, expectations):
            assert_same_tensor(g, want.to(device), "stage_many item")
            ledger.add(g, want)
    else:
        before = pinstage.stage_many([([5, 6], torch.int32), ([1.5], torch.float32)], device=device)
        ledger.add(before[0], torch.tensor([5, 6], dtype=torch.int32))
        ledger.add(before[1], torch.tensor([1.5]))
        with pytest.raises(failing):
            pinstage.stage_many(items, device=device)
    ledger.check()


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(data=data_strategy, dtype=dtype_strategy)
def test_stage_into_is_torch_tensor_or_leaves_out_alone(device, data, dtype):
    want, exc = _expect(data, dtype)
    known = _rectangular_numel(data) if exc is not None else want.numel()
    numel = max(known or 1, 1)
    sentinel = torch.zeros(numel, dtype=dtype)
    out = sentinel.clone().to(device)
    if exc is None and want.numel() == out.numel():
        assert pinstage.stage_into(data, out) is out
        assert_same_tensor(out.view(want.shape), want.to(device), "stage_into %r as %s" % (data, dtype))
        return
    # An empty result cannot fill a one-element out, and a ragged one has no size to match: both
    # are ValueErrors (of the size check, or torch's own for ragged data).
    refused = (ValueError,) if exc is None else (type(exc),) if known else (type(exc), ValueError)
    with pytest.raises(refused):
        pinstage.stage_into(data, out)
    assert_same_tensor(out, sentinel.to(device), "out after a refused stage_into")
