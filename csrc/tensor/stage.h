// The staging operations: Python data -> convert -> ring region -> one async copy -> device tensor.
// Arguments are the raw Python objects so that the bindings add no conversions of their own.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <vector>

namespace pinstage {

at::Tensor stage_to_device(PyObject* data, PyObject* dtype, PyObject* stream, PyObject* device);
std::vector<at::Tensor> stage_many(PyObject* items, PyObject* stream, PyObject* device);
// Fills the tensor `out` (a torch.Tensor object); the binding hands the caller's object back.
void stage_into(PyObject* data, PyObject* out, PyObject* stream);

}  // namespace pinstage
