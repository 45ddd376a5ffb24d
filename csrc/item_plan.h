// ItemPlan: what one (data, dtype) pair will become, decided before any ring memory is taken:
// its shape and byte count, and whether the fast converter writes it or a host tensor made by
// torch.tensor's own rules (the fallback) is copied.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <vector>

namespace pinstage {

struct ItemPlan {
  PyObject* data = nullptr;  // borrowed from the caller's arguments
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  size_t nbytes = 0;
  bool fast = false;
  bool via_fallback = false;  // converted by torch.tensor (counted in stats()["fallbacks"])
  at::Tensor host;  // set when !fast: contiguous CPU tensor with the final values
};

// numel(shape) and its byte count as `dtype`; RuntimeError when either exceeds int64, as torch's
// own storage size check does.
size_t checked_nbytes(c10::IntArrayRef shape, c10::ScalarType dtype, int64_t* numel);

// Parses a torch.dtype argument; TypeError for anything else or for an unsupported dtype.
c10::ScalarType parse_dtype(PyObject* dtype, const char* what);

// Registers the Python function that converts what the fast path declines:
// fallback(data, dtype) -> CPU tensor equal to torch.tensor(data, dtype=dtype), raising what
// torch.tensor raises with the offending element's index named.
void set_fallback(PyObject* fn);

ItemPlan plan_item(PyObject* data, c10::ScalarType dtype);

// Writes the plan's bytes to dst (nbytes of room; may be null when nbytes is 0, the data is then
// only validated). Falls back to torch.tensor's conversion when the fast path declines; throws
// (pybind11::error_already_set) when that raises. Returns true if the fallback was used.
bool write_item(ItemPlan& plan, void* dst);

// The plan's values as a fresh CPU tensor (for results on the CPU and for stage_into's checks).
at::Tensor host_tensor(ItemPlan& plan);

}  // namespace pinstage
