#include "tensor/static_inputs.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>

#include "convert/tensor_memory.h"
#include "copy/target.h"
#include "python/error_prefix.h"
#include "ring/options.h"
#include "ring/registry.h"
#include "tensor/staging_scope.h"

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "copy/ring_copy.h"
#endif

namespace pinstage {
namespace {

// `count` copies of the `size`-byte value at `value` written to dst, by doubling copies: the fill of
// a field of any element size costs a few memcpy calls.
void repeat_value(uint8_t* dst, const void* value, size_t size, size_t count) {
  const size_t total = size * count;
  if (total == 0) return;
  std::memcpy(dst, value, size);
  for (size_t done = size; done < total;) {
    const size_t chunk = std::min(done, total - done);
    std::memcpy(dst + done, dst, chunk);
    done += chunk;
  }
}

}  // namespace

StaticInputs::StaticInputs(const std::vector<StaticFieldSpec>& specs, int64_t max_bs, PyObject* device)
    : last_staged_(specs.size()), max_bs_(max_bs), device_(resolve_device(device)) {
  TORCH_CHECK_VALUE(!specs.empty(), "pinstage.StaticInputs: at least one field is needed");
  TORCH_CHECK_VALUE(max_bs > 0, "pinstage.StaticInputs: max_bs must be positive, got ", max_bs);
  std::vector<std::vector<int64_t>> shapes;
  std::vector<size_t> field_bytes;
  for (const StaticFieldSpec& spec : specs) {
    Field f{
        THPObjectPtr(checked(PyUnicode_FromStringAndSize(spec.name.data(), static_cast<Py_ssize_t>(spec.name.size())))),
        spec.name,
        spec.dtype,
        spec.row_shape,
        0,
        0,
        0,
        spec.persistent};
    for (int64_t s : spec.row_shape) {
      TORCH_CHECK_VALUE(s >= 0, "pinstage.StaticInputs: ", f.label(), " has a negative dimension in its shape ",
                        c10::IntArrayRef(spec.row_shape));
    }
    // Its bytes are read below: a fill made under a dispatch mode (a FakeTensor) has none.
    const at::Tensor& fill = spec.fill;
    TORCH_CHECK_TYPE(
        has_real_memory(fill) && fill.device().is_cpu() && fill.scalar_type() == spec.dtype && fill.numel() == 1,
        "pinstage.StaticInputs: ", f.label(), ": fill must be one CPU value of its dtype held in memory");
    // A shape too large to describe raises torch's error, which names no field: this names it.
    const auto named = [&f] { return "pinstage.StaticInputs: " + f.label(); };
    f.row_bytes = with_error_prefix(named, [&] { return checked_nbytes(spec.row_shape, spec.dtype, &f.row_numel); });
    std::vector<int64_t> shape{max_bs};
    shape.insert(shape.end(), spec.row_shape.begin(), spec.row_shape.end());
    int64_t numel = 0;
    field_bytes.push_back(with_error_prefix(named, [&] { return checked_nbytes(shape, spec.dtype, &numel); }));
    fields_.push_back(std::move(f));
    shapes.push_back(std::move(shape));
  }
  // Staged fields first, in declared order, so that one copy from the start covers them; the
  // persistent ones after them, outside that copy.
  size_t end = 0;
  for (const bool persistent : {false, true}) {
    for (size_t i = 0; i < fields_.size(); ++i) {
      Field& f = fields_[i];
      if (f.persistent != persistent) continue;
      const size_t bytes = field_bytes[i];
      TORCH_CHECK(bytes <= static_cast<size_t>(INT64_MAX) - kStagingAlignment &&
                      end <= static_cast<size_t>(INT64_MAX) - kStagingAlignment - bytes,
                  "pinstage.StaticInputs: the fields together are more than 2**63 bytes");
      f.offset = align_up(end, kStagingAlignment);
      end = f.offset + bytes;
      if (!persistent) last_staged_ = i;
    }
  }
  fill_image_.assign(end, 0);
  for (size_t i = 0; i < fields_.size(); ++i) {
    const Field& f = fields_[i];
    repeat_value(fill_image_.data() + f.offset, specs[i].fill.const_data_ptr(), c10::elementSize(f.dtype),
                 static_cast<size_t>(max_bs) * static_cast<size_t>(f.row_numel));
  }
#ifdef PINSTAGE_WITH_CUDA
  if (device_.is_cuda()) {
    allocation_stream_ = c10::cuda::getCurrentCUDAStream(device_.index());
    check_not_capturing(*allocation_stream_, "StaticInputs");  // before a graph's pool gets the allocation
    if (std::any_of(fields_.begin(), fields_.end(), [](const Field& f) { return f.persistent; })) {
      // The row-write kernel reads the pinned ring region in place, at its host address.
      int unified = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device_.index()));
      TORCH_CHECK(unified == 1, "pinstage.StaticInputs: persistent fields need unified addressing, which cuda:",
                  static_cast<int>(device_.index()), " lacks");
    }
  }
#endif
  {
    // Real memory under FakeTensorMode too, as stage_to_device's results: the views are what a
    // graph captures and what stage() writes.
    const NoPythonDispatch no_python;
    buffer_ = at::empty({static_cast<int64_t>(end)}, at::TensorOptions().dtype(c10::kByte).device(device_));
    for (size_t i = 0; i < fields_.size(); ++i) {
      const Field& f = fields_[i];
      views_.push_back(buffer_.narrow(0, static_cast<int64_t>(f.offset), static_cast<int64_t>(max_bs * f.row_bytes))
                           .view(f.dtype)
                           .view(shapes[i]));
    }
  }
  data_ = buffer_.storage().data();
  // Every row of every field at its fill, by the path a stage takes.
  const auto fills = [this](uint8_t* region) {
    if (!fill_image_.empty()) std::memcpy(region, fill_image_.data(), fill_image_.size());
    return size_t{0};
  };
  if (device_.is_cpu()) {
    copy_to_host_buffer(end, fills);
  } else {
#ifdef PINSTAGE_WITH_CUDA
    copy_to_device(end, fills, *allocation_stream_);
#endif
  }
}

int64_t StaticInputs::index_arg(PyObject* v, int64_t hi, const char* api, const char* what, const char* hi_name) {
  const char* sep = *api != '\0' ? ": " : "";
  TORCH_CHECK_TYPE(PyIndex_Check(v) && !PyBool_Check(v), api, sep, what, " must be an int, got ", Py_TYPE(v)->tp_name);
  THPObjectPtr index(checked(PyNumber_Index(v)));
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.get(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw PythonError();
  if (overflow != 0 || value < 0 || value > hi) {
    THPObjectPtr text(checked(PyObject_Str(index.get())));
    TORCH_CHECK_VALUE(false, api, sep, what, " must be between 0 and ", hi_name, hi, ", got ",
                      PyUnicode_AsUTF8(text.get()));
  }
  return value;
}

template <class Fn>
auto StaticInputs::for_field(size_t i, Fn&& fn) const -> decltype(fn()) {
  return with_error_prefix([&] { return std::string(kStage) + ": " + fields_[i].label(); }, std::forward<Fn>(fn));
}

void StaticInputs::stage(PyObject* values, PyObject* n_arg, PyObject* stream) {
  const int64_t n = index_arg(n_arg, max_bs_, kStage, "n", "max_bs=");
  // No stream on the CPU.
  [[maybe_unused]] const Target target = target_on(device_, stream, "StaticInputs.stage");
  const StagingScope scope(staging_, kStage);
  FieldValues data = field_values(values);
  // The copy's extent depends on n and the pending writes alone, so the region is taken first and
  // each field is converted straight into it.
  const int64_t written_rows = pending_last_rows();
  const int64_t last_rows = std::max({n, dirty_rows_, written_rows});
  const size_t bytes = bytes_through(last_rows);
  const auto write = [&](uint8_t* region) { return write_region(region, data, n, last_rows); };
  try {
    if (device_.is_cpu()) {
      copy_to_host_buffer(bytes, write);
    } else {
#ifdef PINSTAGE_WITH_CUDA
      copy_to_device(bytes, write, *target.stream);
#endif
    }
  } catch (...) {
    // A failure after the copy was enqueued (the row-write kernel's launch, the fence) leaves this
    // step's n rows written: the next stage refills them, whatever happened.
    dirty_rows_ = std::max(dirty_rows_, n);
    throw;
  }
  dirty_rows_ = std::max(n, written_rows);
  pending_.clear();
  pending_bytes_.clear();
}

int64_t StaticInputs::pending_last_rows() const {
  int64_t rows = 0;
  for (const PendingWrite& w : pending_) {
    if (w.field == last_staged_) rows = std::max(rows, w.row + 1);
  }
  return rows;
}

StaticInputs::FieldValues StaticInputs::field_values(PyObject* values) const {
  TORCH_CHECK_TYPE(PyDict_Check(values), kStage, ": values must be a dict of field name -> values, got ",
                   Py_TYPE(values)->tp_name);
  FieldValues out(fields_.size());
  Py_ssize_t staged = 0;
  for (size_t i = 0; i < fields_.size(); ++i) {
    const Field& f = fields_[i];
    if (f.persistent) continue;
    ++staged;
    PyObject* v = PyDict_GetItemWithError(values, f.name.get());
    if (v == nullptr) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s: no values for %s", kStage, f.label().c_str());
      throw PythonError();
    }
    out[i] = THPObjectPtr::dup(v);  // held: Python code run later may remove it from the dict
  }
  if (PyDict_Size(values) == staged) return out;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(values, &pos, &key, &value)) {
    const Field& f = field_named(key, kStage);
    TORCH_CHECK_VALUE(!f.persistent, kStage, ": ", f.label(),
                      " is persistent: stage() takes no values for it; change its rows with write_rows()");
  }
  return out;
}

const StaticInputs::Field& StaticInputs::field_named(PyObject* name, const char* api) const {
  if (PyUnicode_Check(name)) {
    for (const Field& f : fields_) {
      if (PyUnicode_Compare(name, f.name.get()) == 0) return f;
    }
    if (PyErr_Occurred()) throw PythonError();
  }
  std::string names;
  for (const Field& f : fields_) names += (names.empty() ? "'" : ", '") + f.name_text + "'";
  THPObjectPtr text(checked(PyObject_Repr(name)));
  TORCH_CHECK_VALUE(false, api, ": unknown field ", PyUnicode_AsUTF8(text.get()), " (the fields are ", names, ")");
}

void StaticInputs::check_rows(size_t i, const ItemPlan& plan, int64_t n) const {
  const Field& f = fields_[i];
  TORCH_CHECK_VALUE(plan.numel == n * f.row_numel, "data of shape ", c10::IntArrayRef(plan.shape), " has ", plan.numel,
                    " elements, but n=", n, " rows of shape ", c10::IntArrayRef(f.row_shape), " are ", n * f.row_numel);
}

size_t StaticInputs::bytes_through(int64_t rows) const {
  if (last_staged_ == fields_.size()) return 0;
  return fields_[last_staged_].offset + static_cast<size_t>(rows) * fields_[last_staged_].row_bytes;
}

size_t StaticInputs::write_region(uint8_t* region, FieldValues& data, int64_t n, int64_t last_rows) const {
  size_t fallbacks = 0;
  for (size_t i = 0; i < fields_.size(); ++i) {
    const Field& f = fields_[i];
    if (f.persistent) continue;
    for_field(i, [&] {
      ItemPlan plan = plan_item(data[i].get(), f.dtype);  // a fallback's Python code runs here
      check_rows(i, plan, n);
      write_fresh_item(plan, plan.nbytes > 0 ? region + f.offset : nullptr);
      fallbacks += plan.via_fallback ? 1 : 0;
    });
    const size_t rows_end = static_cast<size_t>(i == last_staged_ ? last_rows : max_bs_);
    const size_t from = f.offset + static_cast<size_t>(n) * f.row_bytes;
    const size_t to = f.offset + rows_end * f.row_bytes;
    if (to > from) std::memcpy(region + from, fill_image_.data() + from, to - from);
  }
  apply_writes(region, false);  // over this step's values
  return fallbacks;
}

size_t StaticInputs::apply_writes(uint8_t* base, bool persistent) const {
  size_t written = 0;
  for (const PendingWrite& w : pending_) {  // in call order: a later write wins
    if (fields_[w.field].persistent != persistent || w.nbytes == 0) continue;
    std::memcpy(base + w.dst, pending_bytes_.data() + w.src, w.nbytes);
    written += w.nbytes;
  }
  return written;
}

void StaticInputs::check_storage_intact() const {
  TORCH_CHECK(buffer_.storage().data() == data_ && buffer_.storage().nbytes() >= static_cast<size_t>(buffer_.numel()),
              kStage,
              ": the inputs' memory was replaced or resized (through a view's storage) while the values were "
              "being converted; a graph captured its old address; nothing was staged");
}

void StaticInputs::copy_to_host_buffer(size_t bytes, RegionWriter write) {
  // Through a region of its own: a bad value in a later field must leave the views as they were.
  host_region_.resize(std::max<size_t>(bytes, 1));
  const size_t fallbacks = write(host_region_.data());
  check_storage_intact();
  uint8_t* const allocation = static_cast<uint8_t*>(buffer_.data_ptr());
  if (bytes > 0) std::memcpy(allocation, host_region_.data(), bytes);
  cpu_counters().record(bytes + apply_writes(allocation, true), 0, fallbacks);
}

#ifdef PINSTAGE_WITH_CUDA
void* StaticInputs::record_on(const c10::cuda::CUDAStream& stream) {
  check_storage_intact();
  if (stream != *allocation_stream_ &&
      std::find(recorded_streams_.begin(), recorded_streams_.end(), stream) == recorded_streams_.end()) {
    c10::cuda::CUDACachingAllocator::recordStream(buffer_.storage().data_ptr(), stream);
    recorded_streams_.push_back(stream);
  }
  return buffer_.data_ptr();
}

void StaticInputs::copy_to_device(size_t bytes, RegionWriter write, const c10::cuda::CUDAStream& stream) {
  c10::cuda::CUDAGuard device_guard(device_.index());
  if (!writes_persistent()) {
    copy_through_ring(device_.index(), bytes, stream.stream(), write, [&]() -> void* { return record_on(stream); });
    return;
  }
  // The step's bytes, then the packed writes, in ONE region: one copy of the first part, then the
  // kernel that reads the second part in place; the region is sealed behind both.
  const WritePlan plan = plan_writes();
  StagingRing& ring = ring_for(device_.index(), Direction::kToDevice);
  const size_t packed_at = align_up(bytes, kStagingAlignment);
  const size_t total = packed_at + plan.bytes;
  LeaseGuard lease(ring, total);
  const size_t fallbacks = write(lease.data());
  void* const dst = record_on(stream);
  const RowWriteParams params = pack_writes(plan, lease.data() + packed_at, static_cast<uint8_t*>(dst));
  if (bytes > 0) lease.copy(dst, lease.data(), bytes, cudaMemcpyHostToDevice, stream.stream());
  const int launched = launch_row_writes(params, stream.stream());
  // Sealed behind the kernel whether or not it was launched: the copy may have been.
  lease.commit(stream.stream());
  C10_CUDA_CHECK(static_cast<cudaError_t>(launched));
  ring.counters().record(total, bytes > 0 ? 1 : 0, fallbacks);
}
#endif

}  // namespace pinstage
