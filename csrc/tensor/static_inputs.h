// StaticInputs: a CUDA graph's static inputs as named fields of ONE allocation, each a view
// [max_bs, *row_shape] at a 16-byte aligned offset, filled from host values by ONE copy per step
// from a staging ring region laid out like the allocation. Rows n..max_bs hold each field's fill.
// Persistent fields (laid out after the others, outside the copy) keep their rows between stages and
// change by row writes, which a stage applies with one kernel reading them from the same region.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/core/Device.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert/item_plan.h"
#include "python/py_objects.h"
#include "tensor/row_writes.h"

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace pinstage {

struct StaticFieldSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> row_shape;
  at::Tensor fill;          // 0-d CPU tensor of dtype: what rows n..max_bs hold after a stage
  bool persistent = false;  // kept between stages, changed by write_rows only
};

class StaticInputs {
 public:
  // Allocates the fields on `device` (resolved as stage_to_device resolves it) and fills every row
  // with its field's fill value, by one copy on the device's current stream.
  StaticInputs(const std::vector<StaticFieldSpec>& fields, int64_t max_bs, PyObject* device);
  StaticInputs(const StaticInputs&) = delete;
  StaticInputs& operator=(const StaticInputs&) = delete;

  // values: a dict with every staged (non-persistent) field's values (n rows each, anything
  // stage_to_device takes); then the pending row writes are applied. An error names the field and
  // stages nothing (the writes stay pending). One set of graph inputs has one writer: a stage() or
  // write_rows() entered while another runs (from a conversion's Python code, or another thread) raises.
  void stage(PyObject* values, PyObject* n, PyObject* stream);

  // Keeps writes values[i] -> field `name`'s row rows[i] (flattened) from element starts[i] on, for
  // the next stage(), which applies them after the fields' values, in call order. Checked and
  // converted here: an error names the field and the write and keeps nothing of this call.
  void write_rows(PyObject* name, PyObject* rows, PyObject* starts, PyObject* values);
  size_t pending_writes() const { return pending_.size(); }

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
    bool persistent;
  };

  // A write kept for the next stage: its bytes at `src` in pending_bytes_, `dst` in the allocation.
  struct PendingWrite {
    size_t field;
    int64_t row;
    size_t dst;
    size_t src;
    size_t nbytes;
  };

  // An int argument (operator.index, not bool) in [0, hi]; its errors open with "api: what" (just
  // "what" when api is empty) and name hi after hi_name ("max_bs=").
  static int64_t index_arg(PyObject* v, int64_t hi, const char* api, const char* what, const char* hi_name = "");
  using FieldValues = std::vector<THPObjectPtr>;  // one per field (null: persistent)
  FieldValues field_values(PyObject* values) const;
  // Runs fn() with errors naming field i.
  template <class Fn>
  auto for_field(size_t i, Fn&& fn) const -> decltype(fn());
  void check_rows(size_t i, const ItemPlan& plan, int64_t n) const;
  // The field called `name` (only a str names one); otherwise a ValueError, opened by api, that
  // names it as unknown and lists the fields.
  const Field& field_named(PyObject* name, const char* api) const;
  // Bytes [0, end) of the allocation where the last staged field's first `rows` rows end: what one
  // copy covers (0 when every field is persistent).
  size_t bytes_through(int64_t rows) const;
  // Converts each staged field's values straight into `region` (which mirrors the allocation up to
  // bytes_through(last_rows)) as it is planned, then its fill rows, then the pending writes into
  // those fields; returns how many fields went through torch.tensor. A field's Python code (a
  // fallback) runs after the fields before it are written, so it cannot change them.
  size_t write_region(uint8_t* region, FieldValues& data, int64_t n, int64_t last_rows) const;
  // Copies the pending writes into the persistent (or the staged) fields to `base`, laid out like
  // the allocation, in call order; returns their bytes.
  size_t apply_writes(uint8_t* base, bool persistent) const;
  // Fills a region of the copy's bytes (a stage's write_region, the construction's fills); returns
  // how many fields went through torch.tensor.
  using RegionWriter = c10::function_ref<size_t(uint8_t*)>;
  // Copies the allocation's first `bytes` from a region `write` fills, then applies the pending
  // writes into persistent fields.
  void copy_to_host_buffer(size_t bytes, RegionWriter write);
#ifdef PINSTAGE_WITH_CUDA
  void copy_to_device(size_t bytes, RegionWriter write, const c10::cuda::CUDAStream& stream);
  bool writes_persistent() const;  // whether a pending write goes to a persistent field
  // How the pending writes into persistent fields are packed: their order (grouped by field and
  // row, call order within a group), where each group starts in it, records or ops, and the bytes
  // that takes.
  struct WritePlan {
    std::vector<uint32_t> order;
    std::vector<uint32_t> starts;  // [groups + 1]: each group's first index in order, then order.size()
    bool records = false;
    size_t bytes = 0;
  };
  WritePlan plan_writes() const;
  // Packs them at `packed` (plan.bytes of ring memory); returns the kernel's parameters.
  RowWriteParams pack_writes(const WritePlan& plan, uint8_t* packed, uint8_t* allocation) const;
  void* record_on(const c10::cuda::CUDAStream& stream);
#endif
  int64_t pending_last_rows() const;  // rows of the last staged field that pending writes reach
  // Python code run during a conversion (the fallback) could shrink the allocation's storage.
  void check_storage_intact() const;

  std::vector<Field> fields_;
  size_t last_staged_;  // the staged field laid out last (fields_.size(): none)
  int64_t max_bs_;
  c10::Device device_;
  at::Tensor buffer_;           // uint8, the one allocation
  const void* data_ = nullptr;  // its address, which a captured graph reads
  std::vector<at::Tensor> views_;
  std::vector<uint8_t> fill_image_;  // the whole allocation with every row at its field's fill
  // Rows of the LAST staged field that may hold something other than its fill (values, row writes).
  // Every other staged field is copied whole (the copy runs to the last one's rows), so only the
  // last one's rows beyond n can be stale from an earlier, larger n; the copy extends over them.
  // Read and written with the GIL held.
  int64_t dirty_rows_ = 0;
  bool staging_ = false;  // a stage() or write_rows() is running (with the GIL held, or waiting for ring room)
  // Writes for the next stage, in call order, and their converted values (each at a 16-byte offset).
  std::vector<PendingWrite> pending_;
  std::vector<uint8_t> pending_bytes_;
  std::vector<uint8_t> host_region_;  // the CPU path's region: one stage() at a time uses it
#ifdef PINSTAGE_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> allocation_stream_;
  // Streams other than the allocating one that copied into the allocation: the caching allocator
  // must not reuse it, once freed, before their copies are done.
  std::vector<c10::cuda::CUDAStream> recorded_streams_;
#endif
};

}  // namespace pinstage
