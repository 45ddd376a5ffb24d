// C++ exceptions to Python ones, one way for every entry point: torch's own translation
// (HANDLE_TH_ERRORS: c10::ValueError -> ValueError, OutOfMemoryError -> torch.OutOfMemoryError, ...),
// plus pinstage.RingFullError for a full ring under on_full="error".
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "ring/options.h"

namespace pinstage {

namespace py = pybind11;

// pinstage.RingFullError (a RuntimeError subclass), made once when the module is initialised.
PyObject* ring_full_error_type();
void add_ring_full_error(pybind11::module_& m);

// Sets pinstage.RingFullError and throws torch's python_error, which HANDLE_TH_ERRORS passes on.
[[noreturn]] void raise_ring_full(const RingFullError& e);

// fn() for a pybind11 binding: its C++ exceptions become the Python exceptions above.
template <class Fn>
auto translate_errors(Fn&& fn) -> decltype(fn()) {
  HANDLE_TH_ERRORS
  try {
    return fn();
  } catch (const RingFullError& e) {
    raise_ring_full(e);
  }
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace pinstage
