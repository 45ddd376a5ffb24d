#include "convert.h"

#include <c10/util/TypeCast.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "dtypes.h"

namespace pinstage {
namespace {

inline bool is_fast_scalar(PyObject* o) {
  return PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyBool_Check(o);
}

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

template <class T>
inline bool store_integral(PyObject* o, T* out) {
  using Limits = std::numeric_limits<T>;
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || !int_fits<T>(v)) return false;  // beyond int64 or T: torch decides
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

// Range elements are ints computed from start/step; each still passes through store() semantics.
template <class T>
bool write_range(PyObject* r, int64_t n, T* out) {
  PyObject* start_obj = PyObject_GetAttrString(r, "start");
  PyObject* step_obj = PyObject_GetAttrString(r, "step");
  bool ok = start_obj != nullptr && step_obj != nullptr;
  long long start = 0, step = 0;
  if (ok) {
    int o1 = 0, o2 = 0;
    start = PyLong_AsLongLongAndOverflow(start_obj, &o1);
    step = PyLong_AsLongLongAndOverflow(step_obj, &o2);
    ok = o1 == 0 && o2 == 0 && !PyErr_Occurred();
  }
  Py_XDECREF(start_obj);
  Py_XDECREF(step_obj);
  if (!ok) {
    PyErr_Clear();
    return false;
  }
  // The last element must fit int64 for the arithmetic below to be exact.
  const long double last = static_cast<long double>(start) + static_cast<long double>(step) * (n - 1);
  if (last > 9.2e18L || last < -9.2e18L) return false;
  for (int64_t i = 0; i < n; ++i) {
    const long long v = start + step * i;
    if constexpr (std::is_same_v<T, bool>) {
      out[i] = v != 0;
    } else if constexpr (std::is_integral_v<T>) {
      if (!int_fits<T>(v)) return false;
      out[i] = static_cast<T>(v);
    } else {
      out[i] = c10::convert<T, double>(static_cast<double>(v));
    }
  }
  return true;
}

template <class T>
bool write_level(PyObject* seq, const int64_t* shape, size_t ndim, T*& out) {
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n != shape[0]) return false;  // ragged: torch raises ValueError, let it say so
  PyObject** items = PySequence_Fast_ITEMS(seq);
  if (ndim == 1) {
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!store<T>(items[i], out + i)) return false;
    }
    out += n;
    return true;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!write_level<T>(items[i], shape + 1, ndim - 1, out)) return false;
  }
  return true;
}

}  // namespace

bool infer_fast_shape(PyObject* obj, std::vector<int64_t>* shape) {
  shape->clear();
  if (is_fast_scalar(obj)) return true;
  if (PyRange_Check(obj)) {
    const Py_ssize_t n = PyObject_Size(obj);
    if (n < 0) {
      PyErr_Clear();  // longer than ssize_t: torch raises, let it
      return false;
    }
    shape->push_back(n);
    return true;
  }
  PyObject* level = obj;
  while (PyList_Check(level) || PyTuple_Check(level)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(level);
    shape->push_back(n);
    if (n == 0) return true;  // torch stops at the first empty level too: [[], []] is (2, 0)
    level = PySequence_Fast_ITEMS(level)[0];
  }
  // A numpy array, tensor, str or other sequence below a list makes torch infer more dimensions
  // than this walk did; only a Python scalar as the first leaf keeps both shape inferences equal.
  return !shape->empty() && is_fast_scalar(level);
}

bool write_fast(PyObject* obj, const std::vector<int64_t>& shape, c10::ScalarType dtype, void* dst) {
  return dispatch_dtype(dtype, [&](auto tag) -> bool {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    if (shape.empty()) return store<T>(obj, out);
    if (PyRange_Check(obj)) return shape[0] == 0 || write_range<T>(obj, shape[0], out);
    // Walked even when numel is 0: [[], [1]] is ragged and torch raises for it.
    return write_level<T>(obj, shape.data(), shape.size(), out);
  });
}

}  // namespace pinstage
