#include "fastcall.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <new>

#include "stage.h"

namespace py = pybind11;

namespace pinstage {

void set_python_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "pinstage: unknown C++ exception");
  }
}

namespace {

constexpr const char* kArgNames[] = {"data", "dtype", "stream", "device"};
constexpr Py_ssize_t kPositional = 3;  // device is keyword-only

PyObject* stage_to_device_fastcall(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* slots[4] = {nullptr, nullptr, nullptr, nullptr};
  if (nargs > kPositional) {
    PyErr_Format(PyExc_TypeError, "stage_to_device() takes at most 3 positional arguments (%zd given); device is keyword-only", nargs);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    int slot = -1;
    for (int j = 0; j < 4; ++j) {
      if (PyUnicode_CompareWithASCIIString(name, kArgNames[j]) == 0) {
        slot = j;
        break;
      }
    }
    if (slot < 0) {
      PyErr_Format(PyExc_TypeError, "stage_to_device() got an unexpected keyword argument '%U'", name);
      return nullptr;
    }
    if (slots[slot] != nullptr) {
      PyErr_Format(PyExc_TypeError, "stage_to_device() got multiple values for argument '%s'", kArgNames[slot]);
      return nullptr;
    }
    slots[slot] = args[nargs + k];
  }
  if (slots[0] == nullptr || slots[1] == nullptr) {
    PyErr_SetString(PyExc_TypeError, "stage_to_device() missing required argument 'data' or 'dtype'");
    return nullptr;
  }
  try {
    at::Tensor out = stage_to_device(slots[0], slots[1], slots[2] ? slots[2] : Py_None, slots[3] ? slots[3] : Py_None);
    return THPVariable_Wrap(std::move(out));
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
}

}  // namespace

PyMethodDef kStageToDeviceDef = {
    "stage_to_device", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&stage_to_device_fastcall)),
    METH_FASTCALL | METH_KEYWORDS,
    "stage_to_device(data, dtype, stream=None, *, device=None)\n--\n\n"
    "torch.tensor(data, dtype=dtype) on the stream's device (else `device`, else the current CUDA device,\n"
    "else the CPU), converted straight into pinned ring memory and copied with one asynchronous copy on\n"
    "`stream` (default: the device's current stream). The host never waits for the device."};

}  // namespace pinstage
