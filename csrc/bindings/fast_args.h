// The arguments of a METH_FASTCALL | METH_KEYWORDS call, by position or by keyword, with Python's
// own TypeErrors. The staging entry points are such functions, called straight from engine code:
// pybind11's dispatcher costs them about 0.4 us a call, and a Python wrapper another 0.1 us.
#pragma once

#include <Python.h>

#include <array>

namespace pinstage {

// The signature `name(p0, ..., p[positional-1], *, kw...)`, with the first `required` names required.
template <size_t N>
struct FastSignature {
  const char* name;
  std::array<const char*, N> params;
  size_t required;
  size_t positional;
};

// Fills out[i] with parameter i's argument (borrowed), Py_None where an optional one is not given.
// Returns false with a TypeError set, worded as CPython's own C functions word it.
template <size_t N>
bool parse_fast_args(const FastSignature<N>& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     std::array<PyObject*, N>& out) {
  const auto given = static_cast<size_t>(nargs);
  if (given > sig.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes %s %zu positional arguments (%zd given)", sig.name,
                 sig.required == sig.positional ? "exactly" : "at most", sig.positional, nargs);
    return false;
  }
  out.fill(nullptr);
  for (size_t i = 0; i < given; ++i) out[i] = args[i];
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < keywords; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    // Compared as a whole str: no encoding (a lone surrogate is just an unknown name) and an
    // embedded NUL does not end the name early.
    size_t i = 0;
    while (i < N && PyUnicode_CompareWithASCIIString(key, sig.params[i]) != 0) ++i;
    if (i == N) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", sig.name, key);
      return false;
    }
    if (out[i] != nullptr) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", sig.name, sig.params[i]);
      return false;
    }
    out[i] = args[nargs + k];
  }
  for (size_t i = 0; i < N; ++i) {
    if (out[i] != nullptr) continue;
    if (i < sig.required) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", sig.name, sig.params[i]);
      return false;
    }
    out[i] = Py_None;
  }
  return true;
}

}  // namespace pinstage
