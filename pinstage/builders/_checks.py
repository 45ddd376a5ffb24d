"""Validation for the builders: cheap whole-list checks, with a Python walk only on failure to name
the offending request."""
import numbers


def raise_first_invalid(values, field, is_valid, expected):
    """Raise for the first value failing is_valid: TypeError if it is not a real number, else
    ValueError; the message names the request index and the field."""
    for i, value in enumerate(values):
        if not isinstance(value, numbers.Real):
            raise TypeError(f"request {i}: {field} must be a real number, got {type(value).__name__}")
        if not is_valid(value):
            raise ValueError(f"request {i}: {field} must be {expected}, got {value!r}")
    raise AssertionError(f"{field}: the list check failed but no element fails it")


def checked_bounds(values, field, is_valid, expected):
    """(min, max) of a non-empty list whose values all pass is_valid, an interval test.

    Works on the set of distinct values: a batch carries few distinct sampling settings, so one hash
    per request replaces two comparisons per request. min/max skip a NaN that is not first; the sum
    of the distinct values is NaN whenever one of them is.
    """
    try:
        distinct = set(values)
        lo, hi = min(distinct), max(distinct)
        total = sum(distinct)
        ok = total == total and is_valid(lo) and is_valid(hi)
    except TypeError:
        ok = False
    if not ok:
        raise_first_invalid(values, field, is_valid, expected)
    return lo, hi
