"""Validation for the builders: cheap whole-batch checks, with a walk over the requests only on
failure, to name the request and the field."""

import math
from typing import Any, Callable, List, NoReturn, Optional, Sequence, Tuple, TypeGuard, Union

import numpy as np
import numpy.typing as npt
import torch

import pinstage
from pinstage import _C
from pinstage._api import Device
from pinstage._fallback import remade

# (name, one value per request, dtype): a field as stage_fields stages it.
NamedValues = Tuple[str, Union[Sequence[Any], npt.NDArray[Any]], torch.dtype]  # a list or a BatchState column


# The kinds of value a field takes, as tests on a value's type: a batch check tests each distinct
# type once (checked_bounds), the walk that names a request tests its value's type.


def is_int_type(kind: type) -> bool:
    """A Python int that is not a bool (what an integer request field must hold)."""
    return issubclass(kind, int) and not issubclass(kind, bool)


def is_real_type(kind: type) -> bool:
    """A Python int or float that is not a bool (what a real-valued request field must hold)."""
    return issubclass(kind, (int, float)) and not issubclass(kind, bool)


def is_integer_entry_type(kind: type) -> bool:
    """An entry of a per-request integer column: a Python or numpy integer, not a bool."""
    return issubclass(kind, (int, np.integer)) and not issubclass(kind, (bool, np.bool_))


def is_int(value: object) -> bool:
    return is_int_type(type(value))


def is_real(value: object) -> bool:
    return is_real_type(type(value))


def is_integer_entry(value: object) -> TypeGuard[Union[int, np.integer[Any]]]:
    return is_integer_entry_type(type(value))


# A list of Python ints, no bool (or int subclass) among them: read as int64 as given, or refused for
# a value beyond int64. (numpy would make [np.uint64(5), 3] float64 and [True, 2] ints.) The compiled
# test itself, not a Python function around it: the builders call it on every column.
is_plain_int_list = _C.is_plain_int_list


def is_integer_dtype(dtype: Union[torch.dtype, np.dtype[Any]]) -> bool:
    if isinstance(dtype, torch.dtype):
        return not (dtype == torch.bool or dtype.is_floating_point or dtype.is_complex)
    return dtype.kind in "iuO"  # an object array's entries are looked at one by one


def require_host_tensor(name: str, tensor: torch.Tensor) -> None:
    """TypeError for a per-request column on a device: reading its values would wait for the GPU."""
    if tensor.device.type != "cpu":
        raise TypeError(
            f"{name} must be host values (a list, numpy array or CPU tensor), got a tensor on {tensor.device}"
        )


def plain_int_array(values: object) -> Optional[npt.NDArray[np.int64]]:
    """A plain int list (is_plain_int_list) as an int64 array, in one pass in C; None for anything
    else, or a value beyond int64, which the caller's walk over the entries names."""
    if not is_plain_int_list(values):
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def checked_bounds(
    values: Sequence[Any],
    field: str,
    is_valid: Callable[[Any], bool],
    expected: str,
    integer: bool = False,
    numpy_ints: bool = False,
) -> Tuple[Any, Any]:
    """(min, max) of a non-empty list whose values all pass is_valid (an interval test) and, with
    integer=True, are all ints (numpy ints too with numpy_ints=True: an index, where torch.tensor
    reads them as ints). Raises for the first request that does not: TypeError if its value is not
    a number of the right kind, else ValueError; the message names the request and the field.

    Works on the set of distinct values: a batch carries few distinct sampling settings, so one hash
    per request replaces two comparisons per request. The types are a set of their own: 1, 1.0 and
    True are one value in a set, so the values' set cannot tell which types it holds. min/max skip a
    NaN that is not first; the sum of the distinct values is NaN whenever one of them is.
    """
    try:
        distinct = set(values)
        lo, hi = min(distinct), max(distinct)
        kind_ok = (is_integer_entry_type if numpy_ints else is_int_type) if integer else is_real_type
        ok = is_valid(lo) and is_valid(hi) and all(map(kind_ok, set(map(type, values))))
        if ok:
            try:
                total = sum(distinct)
            except OverflowError:  # an int beyond float's range beside a float: look one by one
                total = math.nan if any(v != v for v in distinct) else 0.0
            ok = total == total
    except TypeError:
        ok = False
    if not ok:
        _raise_first_invalid(values, field, is_valid, expected, integer, numpy_ints)
    return lo, hi


def _raise_first_invalid(
    values: Sequence[Any], field: str, is_valid: Callable[[Any], bool], expected: str, integer: bool, numpy_ints: bool
) -> NoReturn:
    kind_ok = (is_integer_entry if numpy_ints else is_int) if integer else is_real
    for i, value in enumerate(values):
        if not kind_ok(value):
            kind = "an int" if integer else "a real number"
            raise TypeError(f"request {i}: {field} must be {kind}, got {type(value).__name__} {value!r}")
        if not is_valid(value):
            raise ValueError(f"request {i}: {field} must be {expected}, got {value!r}")
    raise AssertionError(f"{field}: the batch check failed but no request fails it")


def stage_fields(
    fields: Sequence[NamedValues], stream: Optional[torch.cuda.Stream], device: Device
) -> List[torch.Tensor]:
    """fields: [(name, values, dtype)] with one value per request. Stages them together (one
    stage_many: one ring region, one copy); when a value cannot be converted, raises torch's error
    for it, naming the request and the field."""
    try:
        return pinstage.stage_many([(values, dtype) for _, values, dtype in fields], stream, device=device)
    except pinstage.RingFullError:
        raise  # no value is at fault
    except Exception as exc:  # any class: a value's own code may raise it
        error: BaseException = exc
    # Searched and raised outside the handler, which would make stage_many's error the context of
    # each; the locals are dropped so that the error's traceback (which holds this frame) and the
    # frame do not keep each other alive. Where every value converts alone, the batch is at fault.
    named = None
    try:
        named = _refused_value(fields)
        raise error if named is None else named
    finally:
        del error, named


def _refused_value(fields: Sequence[NamedValues]) -> Optional[BaseException]:
    """torch.tensor's error for the first value it refuses, its class kept (a value's own code may
    raise any), re-made naming the request and the field; None when every value converts."""
    for name, values, dtype in fields:
        for i, value in enumerate(values):
            try:
                torch.tensor(value, dtype=dtype)
            except Exception as refused:  # noqa: BLE001 - the first value torch refuses is the one to name
                return remade(refused, f"request {i}: {name} = {value!r} cannot be converted to {dtype}")
    return None
