// ItemPlan: what one (data, dtype) pair will become, decided before any ring memory is taken: its
// shape and byte count, and where its values come from (the fast converter, a buffer export, a CPU
// tensor, or a host tensor made by torch.tensor's own rules: the fallback).
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/util/DimVector.h>

#include <cstdint>
#include <vector>

#include "convert/buffer_source.h"

namespace pinstage {

struct ItemPlan {
  enum class Source : uint8_t {
    kPython,    // Python scalars, lists, tuples, range: the fast converter
    kBuffer,    // numpy array or scalar, array.array, memoryview, bytearray: `buffer`
    kTensor,    // a CPU tensor with real memory: `tensor`, copied (and cast) by torch's copy kernel
    kHeld,      // `tensor` holds the final values, converted ahead (the fallback, or hold_values)
    kFallback,  // torch.tensor must convert it; not done yet (convert_by_fallback)
  };
  PyObject* data = nullptr;  // borrowed from the caller's arguments
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::DimVector shape;  // inline up to 5 dimensions: planning a call allocates nothing for it
  int64_t numel = 0;
  size_t nbytes = 0;
  Source source = Source::kPython;
  bool via_fallback = false;  // converted by torch.tensor (counted in stats()["fallbacks"])
  at::Tensor tensor;
  BufferSource buffer;
};

// numel(shape) and its byte count as `dtype`, by torch's own storage size arithmetic: RuntimeError
// when the bytes exceed what a storage can hold.
size_t checked_nbytes(c10::IntArrayRef shape, c10::ScalarType dtype, int64_t* numel);

// Parses a torch.dtype argument; TypeError for anything else or for an unsupported dtype.
c10::ScalarType parse_dtype(PyObject* dtype, const char* what);

// Registers the Python function that converts what the fast paths decline:
// fallback(data, dtype) -> CPU tensor equal to torch.tensor(data, dtype=dtype), raising what
// torch.tensor raises with the offending element's index named.
void set_fallback(PyObject* fn);

// Where the item's values come from, decided without running Python code; Source::kFallback when
// torch.tensor must convert it (convert_by_fallback, which runs Python code).
ItemPlan plan_source(PyObject* data, c10::ScalarType dtype);
void convert_by_fallback(ItemPlan& plan);

// plan_source, then convert_by_fallback where needed.
ItemPlan plan_item(PyObject* data, c10::ScalarType dtype);

// Writes the plan's bytes to dst (nbytes of room; may be null when nbytes is 0, the data is then
// only validated). Falls back to torch.tensor's conversion where the fast paths decline (setting
// via_fallback); throws (PythonError) when that raises.
void write_item(ItemPlan& plan, void* dst);

// write_item for a plan that plan_source (and convert_by_fallback) made just now, with no Python
// code run since: a buffer's memory is read as its export showed it, without checking it again.
void write_fresh_item(ItemPlan& plan, void* dst);

// The plan's values as a fresh CPU tensor (for results on the CPU).
at::Tensor cpu_values(ItemPlan& plan);

// Converts the plan's values now into a CPU tensor it holds (Source::kHeld): afterwards nothing
// Python code does to the data changes or frees what the plan writes.
void hold_values(ItemPlan& plan);

// Completes plans.back(), the latest of several items planned in order with plan_source. Where
// torch.tensor must convert it, its Python code may change or free the earlier items' data, so their
// values are taken first, as torch.tensor applied item by item would see them. named(k, fn) runs fn
// with errors naming item k.
template <class Named>
void finish_plan_in_order(std::vector<ItemPlan>& plans, Named&& named) {
  if (plans.back().source != ItemPlan::Source::kFallback) return;
  for (size_t k = 0; k + 1 < plans.size(); ++k) named(k, [&] { hold_values(plans[k]); });
  named(plans.size() - 1, [&] { convert_by_fallback(plans.back()); });
}

}  // namespace pinstage
