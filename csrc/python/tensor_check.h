// The one test for "this Python object is a torch.Tensor" before it is read as one.
#pragma once

#include <torch/csrc/autograd/python_variable.h>

namespace pinstage {

// A real type check: isinstance() (THPVariable_Check) also believes a __class__ property, and an
// object that only claims to be a tensor must never be unpacked as one.
inline bool is_tensor(PyObject* obj) {
  return THPVariableClass != nullptr && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

}  // namespace pinstage
