// StaticInputs: a CUDA graph's static inputs as named fields of ONE allocation, each a view
// [max_bs, *row_shape] at a 16-byte aligned offset, filled from host values by ONE copy per step
// from a staging ring region laid out like the allocation. Rows n..max_bs hold each field's fill.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert/item_plan.h"
#include "python/py_objects.h"

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace pinstage {

struct StaticFieldSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> row_shape;
  at::Tensor fill;  // 0-d CPU tensor of dtype: what rows n..max_bs hold after a stage
};

class StaticInputs {
 public:
  // Allocates the fields on `device` (resolved as stage_to_device resolves it) and fills every row
  // with its field's fill value, by one copy on the device's current stream.
  StaticInputs(const std::vector<StaticFieldSpec>& fields, int64_t max_bs, PyObject* device);
  StaticInputs(const StaticInputs&) = delete;
  StaticInputs& operator=(const StaticInputs&) = delete;

  // values: a dict with every field's values (n rows each, anything stage_to_device takes). An error
  // names the field and stages nothing. One set of graph inputs has one writer: a stage() entered
  // while another runs (from a conversion's Python code, or another thread) raises.
  void stage(PyObject* values, PyObject* n, PyObject* stream);

  const std::vector<at::Tensor>& views() const { return views_; }
  c10::Device device() const { return device_; }

 private:
  struct Field {
    // The dict key looked up each stage; mutable because THPObjectPtr::get() const is const PyObject*.
    mutable THPObjectPtr name;
    std::string name_text;
    std::string label() const { return "field '" + name_text + "'"; }  // for error messages
    c10::ScalarType dtype;
    std::vector<int64_t> row_shape;
    int64_t row_numel;
    size_t row_bytes;
    size_t offset;  // in the allocation, and in every ring region
  };

  using FieldValues = std::vector<THPObjectPtr>;  // one per field, in field order; empty: fills only
  FieldValues field_values(PyObject* values) const;
  // Runs fn() with errors naming field i.
  template <class Fn>
  auto for_field(size_t i, Fn&& fn) const -> decltype(fn());
  void check_rows(size_t i, const ItemPlan& plan, int64_t n) const;
  // Bytes [0, end) of the allocation where the last field's first `rows` rows end: what one copy covers.
  size_t bytes_through(int64_t rows) const;
  // Converts each field's values straight into `region` (which mirrors the allocation up to
  // bytes_through(last_rows)) as it is planned, then its fill rows; returns how many fields went
  // through torch.tensor. A field's Python code (a fallback) runs after the fields before it are
  // written, so it cannot change them.
  size_t write_region(uint8_t* region, FieldValues& data, int64_t n, int64_t last_rows) const;
  void copy_to_host_buffer(FieldValues& data, int64_t n, int64_t last_rows);
#ifdef PINSTAGE_WITH_CUDA
  void copy_to_device(FieldValues& data, int64_t n, int64_t last_rows, const c10::cuda::CUDAStream& stream);
#endif
  // Python code run during a conversion (the fallback) could shrink the allocation's storage.
  void check_storage_intact() const;

  std::vector<Field> fields_;
  int64_t max_bs_;
  c10::Device device_;
  at::Tensor buffer_;           // uint8, the one allocation
  const void* data_ = nullptr;  // its address, which a captured graph reads
  std::vector<at::Tensor> views_;
  std::vector<uint8_t> fill_image_;  // the whole allocation with every row at its field's fill
  // Rows of the LAST field that may hold something other than its fill. Every other field is copied
  // whole (the copy runs to the last field's rows), so only the last one's rows beyond n can be
  // stale from an earlier, larger n; the copy extends over them. Read and written with the GIL held.
  int64_t dirty_rows_;
  bool staging_ = false;              // a stage() is running (with the GIL held, or waiting for ring room)
  std::vector<uint8_t> host_region_;  // the CPU path's region: one stage() at a time uses it
#ifdef PINSTAGE_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> allocation_stream_;
  // Streams other than the allocating one that copied into the allocation: the caching allocator
  // must not reuse it, once freed, before their copies are done.
  std::vector<c10::cuda::CUDAStream> recorded_streams_;
#endif
};

}  // namespace pinstage
