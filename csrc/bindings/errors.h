// C++ exceptions to Python ones, one way for every entry point: torch's own translation
// (HANDLE_TH_ERRORS: c10::ValueError -> ValueError, OutOfMemoryError -> torch.OutOfMemoryError, ...),
// plus pinstage.RingFullError for a full ring under on_full="error" and the Python errors that the
// core leaves set (PythonError). Included by module.cpp only.
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "python/py_objects.h"
#include "ring/options.h"

namespace pinstage {

namespace py = pybind11;

// pinstage.RingFullError (a RuntimeError subclass), made once when the module is initialised.
PyObject* ring_full_error_type();

// fn() with pinstage's own exceptions turned into torch's python_error (the Python error set),
// which HANDLE_TH_ERRORS passes on; every other exception goes on to HANDLE_TH_ERRORS itself.
template <class Fn>
auto translate_core_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const RingFullError& e) {
    PyErr_SetString(ring_full_error_type(), e.what_without_backtrace());
    throw python_error();
  } catch (const PythonError&) {
    throw python_error();
  }
}

// fn() for a pybind11 binding: its C++ exceptions become the Python exceptions above.
template <class Fn>
auto translate_errors(Fn&& fn) -> decltype(fn()) {
  HANDLE_TH_ERRORS
  return translate_core_errors(std::forward<Fn>(fn));
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace pinstage
