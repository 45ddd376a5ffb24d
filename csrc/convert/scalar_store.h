// One number -> one element of a torch dtype, exactly as torch.tensor converts the Python number
// with that value, or a refusal. Used for Python scalars in lists (convert.cpp) and for the elements
// of array.array / memoryview data, which torch.tensor also reads as Python numbers.
#pragma once

#include <Python.h>
#include <c10/util/TypeCast.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace pinstage {

// Each store_* mirrors torch's store_scalar (torch/csrc/utils/python_scalars.h) for a Python number
// of one kind and declines (returns false) wherever torch would raise, wrap, or where the C++ cast
// would be undefined; torch.tensor then decides those cases itself.

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

// A Python int of value v (within int64).
template <class T>
inline bool store_int(long long v, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    *out = v != 0;  // torch: any nonzero integer is true
  } else if constexpr (std::is_integral_v<T>) {
    if (!int_fits<T>(v)) return false;
    *out = static_cast<T>(v);
  } else {
    // Correctly rounded, as PyLong_AsDouble (torch's path through __float__) is; then c10's cast.
    *out = c10::convert<T, double>(static_cast<double>(v));
  }
  return true;
}

// A Python float of value d.
template <class T>
inline bool store_double(double d, T* out) {
  using Limits = std::numeric_limits<T>;
  if constexpr (std::is_same_v<T, bool>) {
    *out = d != 0.0 || std::isnan(d);  // NaN is true, as in torch
  } else if constexpr (std::is_integral_v<T>) {
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
  } else {
    // Same conversion torch applies (c10::convert), so half/bfloat16 rounding matches bit for bit.
    *out = c10::convert<T, double>(d);
  }
  return true;
}

// A Python bool.
template <class T>
inline bool store_bool(bool b, T* out) {
  *out = static_cast<T>(b ? 1 : 0);
  return true;
}

// The value of an exact int, false when it is beyond int64. An int below 2^30 in magnitude (one
// digit: token ids, lengths, row numbers) is read in line, a few instructions where the general
// conversion is a call of a few dozen: through CPython 3.12's unstable API, and on 3.11 from its
// size (the sign with the digit count) and first digit, which 3.11's longintrepr.h always allocates.
inline bool exact_int_value(PyObject* o, long long* v) {
#if PY_VERSION_HEX >= 0x030C0000
  auto* l = reinterpret_cast<PyLongObject*>(o);
  if (PyUnstable_Long_IsCompact(l)) {
    *v = static_cast<long long>(PyUnstable_Long_CompactValue(l));
    return true;
  }
#elif PY_VERSION_HEX >= 0x030B0000
  const Py_ssize_t size = Py_SIZE(o);
  if (size >= -1 && size <= 1) {
    *v = static_cast<long long>(size) * static_cast<long long>(reinterpret_cast<PyLongObject*>(o)->ob_digit[0]);
    return true;
  }
#endif
  int overflow = 0;
  *v = PyLong_AsLongLongAndOverflow(o, &overflow);
  return overflow == 0;
}

// A Python int beyond int64: nonzero, and a double only when one that large exists.
template <class T>
inline bool store_big_int(PyObject* o, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    *out = true;
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    return false;  // torch wraps some (uint64 above 2^63) and raises for others: it decides
  } else {
    const double d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    *out = c10::convert<T, double>(d);
    return true;
  }
}

// One Python object: exact int, float or bool; anything else is declined. Runs no Python code.
template <class T>
inline bool store(PyObject* o, T* out) {
  if (PyLong_CheckExact(o)) {
    long long v = 0;
    return exact_int_value(o, &v) ? store_int<T>(v, out) : store_big_int<T>(o, out);
  }
  if (PyFloat_CheckExact(o)) return store_double<T>(PyFloat_AS_DOUBLE(o), out);
  if (PyBool_Check(o)) return store_bool<T>(o == Py_True, out);
  return false;
}

}  // namespace pinstage
