#include "convert/convert.h"

#include <c10/util/Exception.h>
#include <c10/util/TypeCast.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "convert/dtypes.h"
#include "convert/scalar_store.h"

namespace pinstage {
namespace {

inline bool is_fast_scalar(PyObject* o) { return PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyBool_Check(o); }

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
    if (!store_int<T>(start + step * i, out + i)) return false;
  }
  return true;
}

// Exact lists and tuples only: a subclass may override __iter__ or __len__, which torch.tensor
// calls and the raw item array ignores, so torch converts subclasses itself.
inline bool is_fast_sequence(PyObject* o) { return PyList_CheckExact(o) || PyTuple_CheckExact(o); }

template <class T>
bool write_level(PyObject* seq, const int64_t* shape, size_t ndim, T*& out) {
  if (!is_fast_sequence(seq)) return false;
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

bool infer_fast_shape(PyObject* obj, c10::DimVector* shape) {
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
  while (is_fast_sequence(level)) {
    // torch.tensor's own limit, checked before going deeper: a list nested in itself a million
    // times must raise, not walk (or recurse) that far.
    TORCH_CHECK_VALUE(shape->size() < kMaxDims, "pinstage: too many dimensions '", Py_TYPE(level)->tp_name,
                      "' (torch.tensor allows at most ", kMaxDims, ")");
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(level);
    shape->push_back(n);
    if (n == 0) return true;  // torch stops at the first empty level too: [[], []] is (2, 0)
    level = PySequence_Fast_ITEMS(level)[0];
  }
  // A numpy array, tensor, str or other sequence below a list makes torch infer more dimensions
  // than this walk did; only a Python scalar as the first leaf keeps both shape inferences equal.
  return !shape->empty() && is_fast_scalar(level);
}

bool write_fast(PyObject* obj, c10::IntArrayRef shape, c10::ScalarType dtype, void* dst) {
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
