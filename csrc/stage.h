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

struct Target;

// Values a C++ caller has already converted (the builders' native gathers): `data` holds
// numel(shape) elements of `dtype`, in host memory that stays valid for the call.
struct HostArray {
  const void* data;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

// stage_many for HostArrays: one ring region, one device allocation, ONE copy on the target's
// stream, and views of it; on a CPU target, one host tensor each. `api` names the caller in errors.
// No Python code runs while the region is held.
std::vector<at::Tensor> stage_host_arrays(const std::vector<HostArray>& arrays, const Target& target, const char* api);

}  // namespace pinstage
