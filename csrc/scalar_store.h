// One Python scalar -> one element of a torch dtype, exactly as torch.tensor converts it, or a
// refusal. Shared by the list converter (convert.cpp) and the builders' native gathers, so that a
// value staged either way is the same value.
#pragma once

#include <Python.h>
#include <c10/util/TypeCast.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace pinstage {

// Each store_* mirrors torch's store_scalar (torch/csrc/utils/python_scalars.h) for one family of
// dtypes, and declines (returns false) wherever torch would raise, wrap, or where the C++ cast would
// be undefined; torch.tensor then decides those cases itself.

// True when the int converts to T unchanged. Negative values into unsigned types are declined:
// torch wraps some of them and raises for others, so it decides.
template <class T>
inline bool int_fits(long long v) {
  using Limits = std::numeric_limits<T>;
  if constexpr (Limits::is_signed) {
    return v >= static_cast<long long>(Limits::min()) && v <= static_cast<long long>(Limits::max());
  } else {
    return v >= 0 && static_cast<unsigned long long>(v) <= static_cast<unsigned long long>(Limits::max());
  }
}

// The value of an exact int, false when it is beyond int64. CPython 3.12+ stores ints below 2^30 in
// magnitude ("compact") in one digit and says so through its unstable API: reading that digit in
// line costs a few instructions where the general conversion is a call of a few dozen, and token
// ids, lengths and row numbers are all compact.
inline bool exact_int_value(PyObject* o, long long* v) {
#if PY_VERSION_HEX >= 0x030C0000
  if (PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(o))) {
    *v = static_cast<long long>(PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(o)));
    return true;
  }
#endif
  int overflow = 0;
  *v = PyLong_AsLongLongAndOverflow(o, &overflow);
  return overflow == 0;
}

template <class T>
inline bool store_integral(PyObject* o, T* out) {
  using Limits = std::numeric_limits<T>;
  if (PyLong_CheckExact(o)) {
    long long v = 0;
    if (!exact_int_value(o, &v) || !int_fits<T>(v)) return false;  // beyond int64 or T: torch decides
    *out = static_cast<T>(v);
    return true;
  }
  if (PyFloat_CheckExact(o)) {
    const double d = PyFloat_AS_DOUBLE(o);
    // torch truncates after a range check (c10::checked_convert); NaN, inf and out-of-range values
    // raise there.
    if (!std::isfinite(d)) return false;
    if (d < static_cast<double>(Limits::lowest()) || d > static_cast<double>(Limits::max())) return false;
    // torch refuses floats for uint64 ("an integer is required"); 2^63 bounds the int64 cast.
    if constexpr (std::is_same_v<T, uint64_t>) return false;
    if constexpr (std::is_same_v<T, int64_t>) {
      if (d >= 9223372036854775808.0) return false;
    }
    *out = static_cast<T>(d);
    return true;
  }
  if (PyBool_Check(o)) {
    *out = static_cast<T>(o == Py_True);
    return true;
  }
  return false;
}

template <class T>
inline bool store_floating(PyObject* o, T* out) {
  double d;
  if (PyFloat_CheckExact(o)) {
    d = PyFloat_AS_DOUBLE(o);
  } else if (PyLong_CheckExact(o)) {
    // PyLong_AsDouble rounds correctly, as torch's unpack through __float__ does; huge ints raise.
    d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  } else if (PyBool_Check(o)) {
    d = (o == Py_True) ? 1.0 : 0.0;
  } else {
    return false;
  }
  // Same conversion torch applies (c10::convert), so half/bfloat16 rounding matches bit for bit.
  *out = c10::convert<T, double>(d);
  return true;
}

inline bool store_bool(PyObject* o, bool* out) {
  if (PyBool_Check(o)) {
    *out = (o == Py_True);
    return true;
  }
  if (PyLong_CheckExact(o)) {
    // torch: any nonzero integer is true, including ones too large for int64.
    const int truth = PyObject_IsTrue(o);
    if (truth < 0) {
      PyErr_Clear();
      return false;
    }
    *out = truth == 1;
    return true;
  }
  if (PyFloat_CheckExact(o)) {
    *out = static_cast<bool>(PyFloat_AS_DOUBLE(o));  // NaN is true, as in torch
    return true;
  }
  return false;
}

template <class T>
inline bool store(PyObject* o, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    return store_bool(o, out);
  } else if constexpr (std::is_integral_v<T>) {
    return store_integral<T>(o, out);
  } else {
    return store_floating<T>(o, out);
  }
}

}  // namespace pinstage
