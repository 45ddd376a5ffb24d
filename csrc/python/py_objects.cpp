#include "python/py_objects.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace pinstage {

bool is_tensor(PyObject* obj) {
  return THPVariableClass != nullptr && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

const at::Tensor& unpack_tensor(PyObject* obj) { return THPVariable_Unpack(obj); }

PyObject* wrap_tensor(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

GilReleasedIfHeld::GilReleasedIfHeld() {
  if (PyGILState_Check()) released_ = std::make_unique<pybind11::gil_scoped_release>();
}

GilReleasedIfHeld::~GilReleasedIfHeld() = default;

}  // namespace pinstage
