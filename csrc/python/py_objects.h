// The Python objects pinstage reads besides plain data: tensors, and the Python error indicator.
// Only py_objects.cpp includes torch's Python tensor headers (the heaviest in the build).
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <torch/csrc/utils/object_ptr.h>  // THPObjectPtr: an owned reference

#include <exception>
#include <memory>

namespace pybind11 {
class gil_scoped_release;
}  // namespace pybind11

namespace pinstage {

// A real type check: isinstance() (THPVariable_Check) also believes a __class__ property, and an
// object that only claims to be a tensor must never be unpacked as one.
bool is_tensor(PyObject* obj);

// The tensor a torch.Tensor object holds (its own, not a copy); is_tensor(obj) must hold.
const at::Tensor& unpack_tensor(PyObject* obj);

// A new reference to a torch.Tensor object for t.
PyObject* wrap_tensor(at::Tensor t);

// Thrown where a CPython call failed and left the Python error indicator set; the bindings pass
// that error on to the caller unchanged.
struct PythonError : std::exception {
  const char* what() const noexcept override { return "a Python exception is set"; }
};

// Throws PythonError when obj is null (a failed CPython call), else returns it.
inline PyObject* checked(PyObject* obj) {
  if (obj == nullptr) throw PythonError();
  return obj;
}

// pybind11's gil_scoped_release for its scope where the calling thread holds the GIL (a torch op
// may run without it), so that other Python threads run while this one waits. Out of line: the
// ring's files do not include pybind11.
class GilReleasedIfHeld {
 public:
  GilReleasedIfHeld();
  ~GilReleasedIfHeld();
  GilReleasedIfHeld(const GilReleasedIfHeld&) = delete;
  GilReleasedIfHeld& operator=(const GilReleasedIfHeld&) = delete;

 private:
  std::unique_ptr<pybind11::gil_scoped_release> released_;
};

}  // namespace pinstage
