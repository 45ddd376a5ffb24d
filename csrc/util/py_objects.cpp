#include "util/py_objects.h"

#include <torch/csrc/autograd/python_variable.h>

namespace pinstage {

bool is_tensor(PyObject* obj) {
  return THPVariableClass != nullptr && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

const at::Tensor& unpack_tensor(PyObject* obj) { return THPVariable_Unpack(obj); }

PyObject* wrap_tensor(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

}  // namespace pinstage
