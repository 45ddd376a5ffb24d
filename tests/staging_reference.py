"""The oracle for pinstage's conversion tests: torch.tensor itself, plus seeded value generators.

Every expectation in the tests comes from torch.tensor(data, dtype=dtype); nothing here hard-codes
what a conversion should give. The generators only choose inputs that stress the converter (bounds,
big unsigned ints, nan/inf, double-rounding cases for the half types).
"""

import math
import random
import re
import zlib

import numpy as np
import torch

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
INT_DTYPES = [d for d in DTYPES if d not in (torch.bool,) and not d.is_floating_point]
FLOAT_DTYPES = [d for d in DTYPES if d.is_floating_point]
UNSIGNED_DTYPES = [torch.uint8, torch.uint16, torch.uint32, torch.uint64]

NUMPY_OF = {
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}
# array.array type codes with a fixed width on every platform the tests run on.
ARRAY_CODE_OF = {
    torch.int8: "b",
    torch.uint8: "B",
    torch.int16: "h",
    torch.uint16: "H",
    torch.int32: "i",
    torch.uint32: "I",
    torch.int64: "q",
    torch.uint64: "Q",
    torch.float32: "f",
    torch.float64: "d",
}

# Doubles that round differently when converted straight to the half types than when converted
# through float32 first; torch.tensor's choice is the reference, whichever it is.
DOUBLE_ROUNDING_CASES = [
    1.0 + 2.0**-11 + 2.0**-40,
    -(1.0 + 2.0**-11 + 2.0**-40),
    1.0 + 2.0**-8 + 2.0**-40,
    1.0 + 2.0**-8 - 2.0**-40,
    65504.0 + 16.0,
    65520.0,
    65519.99999999,
    2.0**-24,
    2.0**-25,
    2.0**-25 + 2.0**-60,
    3.0 * 2.0**-26,
    1e-8,
    3.3895313892515355e38,
    3.4028235677973366e38,
    1e39,
    5e-324,
    1.1754943508222875e-38,
]
SPECIAL_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0]


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def int_bounds(dtype):
    if dtype == torch.bool:
        return 0, 1
    info = torch.iinfo(dtype)
    return int(info.min), int(info.max)


def seeded_rng(*key):
    """A random.Random whose seed depends only on key (str hashes are salted per process)."""
    return random.Random(zlib.crc32(repr(key).encode()))


def natural_values(dtype, n, rng):
    """n Python values that torch.tensor accepts for dtype, covering its whole range."""
    if n == 0:
        return []
    if n > 20000:
        return _many_natural_values(dtype, n, rng.randrange(2**32))
    if dtype == torch.bool:
        return [rng.random() < 0.5 for _ in range(n)]
    if dtype.is_floating_point:
        fixed = SPECIAL_FLOATS + DOUBLE_ROUNDING_CASES
        out = []
        for _ in range(n):
            r = rng.random()
            if r < 0.15:
                out.append(fixed[rng.randrange(len(fixed))])
            elif r < 0.55:
                out.append(rng.uniform(-1e4, 1e4))
            elif r < 0.75:
                out.append(float(rng.randint(-(2**20), 2**20)))
            else:
                out.append(rng.gauss(0.0, 1.0) * 10.0 ** rng.randint(-45, 40))
        return out
    lo, hi = int_bounds(dtype)
    edge = [lo, hi, 0, 1, lo + 1, hi - 1] + ([-1] if lo < 0 else [])
    out = [rng.randint(lo, hi) for _ in range(n)]
    for v in edge[: max(0, n - 1)]:
        out[rng.randrange(n)] = v
    return out


def _many_natural_values(dtype, n, seed):
    """natural_values for large n, generated through numpy (same coverage, a hundred times faster)."""
    gen = np.random.default_rng(seed)
    if dtype == torch.bool:
        return (gen.random(n) < 0.5).tolist()
    if dtype.is_floating_point:
        vals = gen.standard_normal(n) * 10.0 ** gen.integers(-45, 40, n)
        plain = gen.random(n) < 0.5
        vals[plain] = gen.uniform(-1e4, 1e4, int(plain.sum()))
        fixed = np.array(SPECIAL_FLOATS + DOUBLE_ROUNDING_CASES)
        where = gen.integers(0, n, n // 20)
        vals[where] = fixed[gen.integers(0, len(fixed), len(where))]
        return vals.tolist()
    lo, hi = int_bounds(dtype)
    np_type = np.uint64 if dtype == torch.uint64 else np.int64
    vals = gen.integers(lo, hi, n, dtype=np_type, endpoint=True)
    edge = [lo, hi, 0, 1] + ([-1] if lo < 0 else [])
    vals[gen.integers(0, n, len(edge))] = np.array(edge, dtype=np_type)
    return vals.tolist()


def safe_float_values(dtype, n, rng):
    """Python floats that every conversion to dtype handles without error or undefined behaviour."""
    if dtype.is_floating_point:
        return [rng.uniform(-1e3, 1e3) for _ in range(n)]
    if dtype == torch.bool:
        return [rng.choice([0.0, 0.5, -1.25, 3.0]) for _ in range(n)]
    lo, hi = int_bounds(dtype)
    lo, hi = max(lo, -(2**31)), min(hi, 2**31)
    return [rng.uniform(lo, hi) for _ in range(n)]


def small_ints(n, rng, unsigned=True):
    """Integers exact in every supported dtype (and non-negative, so casts are defined)."""
    lo = 0 if unsigned else -100
    return [rng.randint(lo, 100) for _ in range(n)]


def expected(data, dtype):
    """(tensor, None) or (None, exception) from torch.tensor(data, dtype=dtype)."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.tensor(data, dtype=dtype), None
    except Exception as exc:  # noqa: BLE001 - the exception itself is the expectation
        return None, exc


def assert_same_tensor(got, want, what=""):
    """Same device, dtype, shape and values; floats compared exactly with nan == nan and -0.0 != 0.0.

    torch.tensor's results are CPU tensors: a caller expecting a result elsewhere moves `want` to the
    device the result must be on. The values are compared on the CPU."""
    assert isinstance(got, torch.Tensor), "%s: got %r, not a tensor" % (what, type(got))
    assert got.device == want.device, "%s: on %s, expected on %s" % (what, got.device, want.device)
    assert got.dtype == want.dtype, "%s: dtype %s, expected %s" % (what, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), "%s: shape %s, expected %s" % (
        what,
        tuple(got.shape),
        tuple(want.shape),
    )
    got, want = got.detach().cpu(), want.detach().cpu()
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: "%s: %s" % (what, m))
        finite = ~torch.isnan(want)
        assert torch.equal(torch.signbit(got)[finite], torch.signbit(want)[finite]), "%s: signed zeros differ" % what
    else:
        if not torch.equal(got, want):
            # tolist, not tensor ops: several ops are missing for uint16/32/64 on the CPU.
            g, w = got.reshape(-1).tolist(), want.reshape(-1).tolist()
            bad = [i for i in range(len(w)) if g[i] != w[i]]
            raise AssertionError(
                "%s: %d values differ; first at flat index %d: got %r, expected %r"
                % (what, len(bad), bad[0], g[bad[0]], w[bad[0]])
            )


def assert_matches_reference(call, data, dtype, what=""):
    """call(data, dtype) behaves as torch.tensor(data, dtype=dtype): same tensor, or same exception type.

    Returns the exception raised (or None) so that callers can check its message further.
    """
    want, want_exc = expected(data, dtype)
    if want_exc is None:
        got = call(data, dtype)
        assert_same_tensor(got, want, what)
        return None
    try:
        got = call(data, dtype)
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, type(want_exc)), "%s: raised %s(%s); torch.tensor raises %s(%s)" % (
            what,
            type(exc).__name__,
            exc,
            type(want_exc).__name__,
            want_exc,
        )
        return exc
    raise AssertionError("%s: returned %r; torch.tensor raises %s(%s)" % (what, got, type(want_exc).__name__, want_exc))


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)", re.I)


def message_names_value(message, value):
    """Whether message shows value: its str/repr, or any number in it equal to the value."""
    if isinstance(value, (np.generic,)):
        value = value.item()
    if str(value) in message or repr(value) in message:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    for token in _NUMBER.findall(message):
        try:
            number = float(token) if isinstance(value, float) else int(token)
        except ValueError:
            try:
                number = float(token)
            except ValueError:
                continue
        if isinstance(value, float) and math.isnan(value):
            if isinstance(number, float) and math.isnan(number):
                return True
        elif number == value:
            return True
    return False


def message_names_index(message, index):
    """Whether message shows the element index, as [i][j], [i, j] or (i, j) (or [i] when 1-D)."""
    parts = [str(i) for i in index]
    forms = [
        "".join("[%s]" % p for p in parts),
        "[%s]" % ", ".join(parts),
        "[%s]" % ",".join(parts),
        "(%s)" % ", ".join(parts),
    ]
    if len(parts) == 1:
        forms.append("(%s,)" % parts[0])
        forms.append("index %s" % parts[0])
    return any(f in message for f in forms)


def assert_error_names(exc, index, value, dtype):
    message = str(exc)
    problems = []
    if index is not None and not message_names_index(message, index):
        problems.append("index %s" % (list(index),))
    if not message_names_value(message, value):
        problems.append("value %r" % (value,))
    if dtype_name(dtype) not in message:
        problems.append("dtype %s" % dtype_name(dtype))
    assert not problems, "message %r does not name the %s" % (message, ", ".join(problems))


def assert_views(inputs, want, what):
    """Every view of the StaticInputs `inputs` is on its device and equals want[name]."""
    for name, expected in want.items():
        assert_same_tensor(inputs[name], expected.to(inputs.device), "%s, field %s" % (what, name))
