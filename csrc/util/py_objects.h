// The Python objects pinstage reads besides plain data: tensors, and the Python error indicator.
// Only py_objects.cpp includes torch's Python tensor headers (the heaviest in the build).
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <torch/csrc/utils/object_ptr.h>  // THPObjectPtr: an owned reference

#include <exception>

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

// Releases the GIL for its scope (a wait that other Python threads need not share). Not pybind11's
// gil_scoped_release: its users (the ring, the lease a torch op takes) do not include pybind11.
class GilReleased {
 public:
  GilReleased() : state_(PyEval_SaveThread()) {}
  ~GilReleased() { PyEval_RestoreThread(state_); }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace pinstage
