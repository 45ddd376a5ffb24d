// The staging operations: Python values -> convert -> ring region -> one async copy -> device
// tensor. Arguments are the raw Python objects so that the bindings add no conversions of their own.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace pinstage {

at::Tensor stage_to_device(PyObject* data, PyObject* dtype, PyObject* stream, PyObject* device);
std::vector<at::Tensor> stage_many(PyObject* items, PyObject* stream, PyObject* device);
// Returns nothing: the binding hands back the caller's own `out` object.
void stage_into(PyObject* data, PyObject* out, PyObject* stream);

}  // namespace pinstage
