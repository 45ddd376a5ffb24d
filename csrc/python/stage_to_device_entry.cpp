#include "python/stage_to_device_entry.h"

#include <torch/csrc/autograd/python_variable.h>

#include "python/errors.h"
#include "stage/stage.h"

namespace pinstage {
namespace {

PyObject* stage_to_device_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "pinstage._C.stage_to_device takes 4 positional arguments (%zd given)", nargs);
    return nullptr;
  }
  try {
    return THPVariable_Wrap(stage_to_device(args[0], args[1], args[2], args[3]));
  } catch (const RingFullError& e) {
    raise_ring_full(e);
  }
  END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef kStageToDeviceEntry = {
    "stage_to_device", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&stage_to_device_entry)),
    METH_FASTCALL, "stage_to_device(data, dtype, stream, device): see pinstage.stage_to_device"};

}  // namespace pinstage
