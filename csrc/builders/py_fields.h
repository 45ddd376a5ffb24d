// Reading request fields from Python objects for the builders' native gathers.
//
// A native gather never raises for the caller's data: anything it is not certain to convert as the
// Python builder would (a missing attribute, a value of another type, a value the builder rejects)
// makes it decline, and the Python builder then runs and stages or raises with its own message.
#pragma once

#include <Python.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

namespace pinstage::builders {

// An interned attribute name, made once per process (the GIL is held by every caller).
#define PINSTAGE_ATTR_NAME(var, literal) \
  static PyObject* const var = PyUnicode_InternFromString(literal)

// obj.name as a new reference, or an empty object (error cleared) when the lookup raises.
inline pybind11::object get_field(PyObject* obj, PyObject* name) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) PyErr_Clear();
  return pybind11::reinterpret_steal<pybind11::object>(value);
}

// A list or tuple: its size and items (borrowed) without copying; false for any other type.
inline bool as_list_or_tuple(PyObject* obj, Py_ssize_t* size, PyObject*** items) {
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) return false;
  *size = PySequence_Fast_GET_SIZE(obj);
  *items = PySequence_Fast_ITEMS(obj);
  return true;
}

// Item i of a list or tuple that had n items, as a strong reference, read afresh: a property
// getter run for an earlier item may have resized or changed the list (a list, not a tuple).
// Empty when the list no longer has n items.
inline pybind11::object item_at(PyObject* seq, Py_ssize_t n, Py_ssize_t i) {
  if (PySequence_Fast_GET_SIZE(seq) != n) return pybind11::object();
  return pybind11::reinterpret_borrow<pybind11::object>(PySequence_Fast_ITEMS(seq)[i]);
}

// An exact Python int (bool excluded) within int64.
inline bool exact_int(PyObject* obj, int64_t* out) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0) return false;
  *out = v;
  return true;
}

// An exact Python float, or an exact int that a double holds exactly: the number the Python
// builder's comparisons see.
inline bool exact_real(PyObject* obj, double* out) {
  if (PyFloat_CheckExact(obj)) {
    *out = PyFloat_AS_DOUBLE(obj);
    return true;
  }
  int64_t v = 0;
  constexpr int64_t kExactInDouble = int64_t{1} << 53;
  if (!exact_int(obj, &v) || v > kExactInDouble || v < -kExactInDouble) return false;
  *out = static_cast<double>(v);
  return true;
}

}  // namespace pinstage::builders
