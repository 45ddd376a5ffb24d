#include "stage.h"

#include <ATen/record_function.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <string>

#include "dtypes.h"
#include "item_plan.h"
#include "staging_registry.h"
#include "target.h"
#include "tensor_check.h"

#ifdef PINSTAGE_WITH_CUDA
#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace py = pybind11;

namespace pinstage {
namespace {

size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

// The most one staging can hold: the largest storage torch can describe.
constexpr size_t kMaxStagingBytes = static_cast<size_t>(INT64_MAX);

// A named range in the torch profiler for each call; free when no profiler is attached.
struct ProfilerRange {
  at::RecordFunction record{at::RecordScope::USER_SCOPE};
  explicit ProfilerRange(const char* name) {
    if (C10_UNLIKELY(record.isActive())) record.before(name);
  }
};

at::Tensor stage_on_cpu(ItemPlan& plan) {
  at::Tensor out = host_tensor(plan);
  auto& c = cpu_counters();
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.bytes_staged.fetch_add(plan.nbytes, std::memory_order_relaxed);
  if (plan.via_fallback) c.fallbacks.fetch_add(1, std::memory_order_relaxed);
  return out;
}

// Re-raises a Python error from item `i` of stage_many with the item named, same exception type.
[[noreturn]] void rethrow_for_item(py::error_already_set& e, size_t i) {
  const std::string msg = "pinstage.stage_many: item " + std::to_string(i) + ": " + py::str(e.value()).cast<std::string>();
  PyErr_SetString(e.type().ptr(), msg.c_str());
  throw py::error_already_set();
}

// Where one item of a one-copy staging sits: what stage_in_one_copy needs to lay it out. The shape
// is borrowed from the caller's plan or array, which outlives the staging (no copy per item).
struct ItemLayout {
  c10::ScalarType dtype;
  at::IntArrayRef shape;
  size_t nbytes;
};

#ifdef PINSTAGE_WITH_CUDA

// A ring lease that is abandoned unless the copy that reads it was committed: an exception between
// reserve and copy (bad input, out of device memory) must not leave a region held forever.
class LeaseGuard {
 public:
  LeaseGuard(StagingRing& ring, size_t bytes) : ring_(ring) {
    for (;;) {
      if (auto lease = ring.try_acquire(bytes)) {
        lease_ = *lease;
        return;
      }
      py::gil_scoped_release no_gil;  // on_full="wait": let other Python threads run meanwhile
      ring.wait_for_oldest();
    }
  }
  ~LeaseGuard() {
    if (lease_.data != nullptr) ring_.abandon(lease_);
  }
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

  uint8_t* data() const { return lease_.data; }

  // Once the copy is enqueued the region must never be given back, even if recording its fence
  // fails: holding it forever is safe, handing it out again while the copy reads it is not.
  void copy_and_commit(void* dst, size_t bytes, const c10::cuda::CUDAStream& stream) {
    C10_CUDA_CHECK(cudaMemcpyAsync(dst, lease_.data, bytes, cudaMemcpyHostToDevice, stream.stream()));
    HostLease enqueued = lease_;
    lease_ = HostLease{};
    ring_.commit(enqueued, stream.stream());
  }

 private:
  StagingRing& ring_;
  HostLease lease_;
};

// Allocates on `stream` through the caching allocator, exactly as a torch op on that stream would
// (the allocator files the block under the current stream). empty_generic is what at::empty does
// for CUDA once the dispatcher has picked the kernel; calling it directly skips the dispatch.
// The caller holds a device guard for the stream's device.
at::Tensor empty_on_stream(at::IntArrayRef shape, c10::ScalarType dtype, const c10::cuda::CUDAStream& stream) {
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  if (c10::cuda::getCurrentCUDAStream(stream.device_index()) != stream) stream_guard.emplace(stream);
  return at::Tensor(at::detail::empty_generic(shape, c10::cuda::CUDACachingAllocator::get(),
                                              c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype, std::nullopt));
}

void count(StagingRing& ring, size_t bytes, size_t fallbacks) {
  auto& c = ring.counters();
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.bytes_staged.fetch_add(bytes, std::memory_order_relaxed);
  if (bytes > 0) c.copies.fetch_add(1, std::memory_order_relaxed);
  if (fallbacks > 0) c.fallbacks.fetch_add(fallbacks, std::memory_order_relaxed);
}

// A tensor of `dtype` and `shape` over `buffer`'s storage at `byte_offset`: a view made without
// the dispatcher (stage_many returns several per call).
at::Tensor typed_view(const at::Tensor& buffer, size_t byte_offset, c10::ScalarType dtype, at::IntArrayRef shape) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()), buffer.key_set(),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_storage_offset(static_cast<int64_t>(byte_offset / c10::elementSize(dtype)));
  impl->set_sizes_contiguous(shape);
  return at::Tensor(std::move(impl));
}

// One region holds every item, each at an aligned offset, written by write(i, dst), which returns
// whether the item took the torch.tensor fallback; the device buffer mirrors that layout so that a
// single copy moves them all, and each result is a view of it. The caller holds a device guard for
// the target's device and has refused capturing streams.
template <class WriteItem>
std::vector<at::Tensor> stage_in_one_copy(const Target& target, const std::vector<ItemLayout>& layouts,
                                          WriteItem&& write) {
  const c10::cuda::CUDAStream& s = *target.stream;
  std::vector<size_t> offsets(layouts.size());
  size_t total = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    // Each item's bytes fit int64 (checked_nbytes); their sum may not.
    TORCH_CHECK(layouts[i].nbytes <= kMaxStagingBytes - kStagingAlignment &&
                    total <= kMaxStagingBytes - kStagingAlignment - layouts[i].nbytes,
                "pinstage: the items together are more than 2**63 bytes");
    offsets[i] = align_up(total, kStagingAlignment);
    total = offsets[i] + layouts[i].nbytes;
  }
  StagingRing& ring = ring_for(target.index);
  std::optional<LeaseGuard> lease;
  if (total > 0) lease.emplace(ring, total);
  size_t fallbacks = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    fallbacks += write(i, layouts[i].nbytes > 0 ? lease->data() + offsets[i] : nullptr) ? 1 : 0;
  }
  // A single item is allocated with its own dtype and shape: no byte buffer and view to make.
  const bool single = layouts.size() == 1;
  at::Tensor buffer = single ? empty_on_stream(layouts[0].shape, layouts[0].dtype, s)
                             : empty_on_stream({static_cast<int64_t>(total)}, c10::ScalarType::Byte, s);
  if (total > 0) lease->copy_and_commit(buffer.data_ptr(), total, s);
  count(ring, total, fallbacks);
  std::vector<at::Tensor> results;
  if (single) {
    results.push_back(std::move(buffer));
    return results;
  }
  results.reserve(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) results.push_back(typed_view(buffer, offsets[i], layouts[i].dtype, layouts[i].shape));
  return results;
}

#endif  // PINSTAGE_WITH_CUDA

}  // namespace

at::Tensor stage_to_device(PyObject* data, PyObject* dtype_obj, PyObject* stream, PyObject* device) {
  ProfilerRange range("pinstage::stage_to_device");
  const c10::ScalarType dtype = parse_dtype(dtype_obj, "dtype");
  const Target target = resolve_target(stream, device);
  if (!target.cuda) {
    ItemPlan plan = plan_item(data, dtype);
    return stage_on_cpu(plan);
  }
#ifdef PINSTAGE_WITH_CUDA
  const c10::cuda::CUDAStream& s = *target.stream;
  check_not_capturing(s, "stage_to_device");
  c10::cuda::CUDAGuard device_guard(target.index);
  ItemPlan plan = plan_item(data, dtype);
  StagingRing& ring = ring_for(target.index);
  if (plan.nbytes == 0) {
    write_item(plan, nullptr);  // validates (a ragged empty list still raises) and writes nothing
    count(ring, 0, plan.via_fallback);
    return empty_on_stream(plan.shape, dtype, s);
  }
  LeaseGuard lease(ring, plan.nbytes);
  write_item(plan, lease.data());
  at::Tensor out = empty_on_stream(plan.shape, dtype, s);
  lease.copy_and_commit(out.data_ptr(), plan.nbytes, s);
  count(ring, plan.nbytes, plan.via_fallback);
  return out;
#else
  TORCH_INTERNAL_ASSERT(false, "unreachable: CUDA target in a CPU-only build");
#endif
}

std::vector<at::Tensor> stage_many(PyObject* items, PyObject* stream, PyObject* device) {
  ProfilerRange range("pinstage::stage_many");
  // A tuple copy, and references to each item's data below: Python code can run between planning
  // and writing (the torch.tensor fallback; other threads while on_full="wait" waits), and must
  // not be able to free what the plans point at by mutating the caller's list.
  TORCH_CHECK_TYPE(PySequence_Check(items), "pinstage.stage_many: items must be a sequence of (data, dtype) pairs");
  py::object seq = py::reinterpret_steal<py::object>(PySequence_Tuple(items));
  if (!seq) throw py::error_already_set();
  const Py_ssize_t n = PyTuple_GET_SIZE(seq.ptr());
  PyObject** pairs = &PyTuple_GET_ITEM(seq.ptr(), 0);
  std::vector<py::object> data_refs;
  data_refs.reserve(static_cast<size_t>(n));
  const Target target = resolve_target(stream, device);
#ifdef PINSTAGE_WITH_CUDA
  if (target.cuda) check_not_capturing(*target.stream, "stage_many");
  std::optional<c10::cuda::CUDAGuard> device_guard;
  if (target.cuda) device_guard.emplace(target.index);
#endif

  std::vector<ItemPlan> plans;
  plans.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = pairs[i];
    TORCH_CHECK_TYPE((PyTuple_Check(pair) || PyList_Check(pair)) && PySequence_Fast_GET_SIZE(pair) == 2,
                     "pinstage.stage_many: item ", i, " must be a (data, dtype) pair, got ", Py_TYPE(pair)->tp_name);
    PyObject** fields = PySequence_Fast_ITEMS(pair);
    data_refs.push_back(py::reinterpret_borrow<py::object>(fields[0]));
    try {
      plans.push_back(plan_item(fields[0], parse_dtype(fields[1], "dtype")));
    } catch (py::error_already_set& e) {
      rethrow_for_item(e, static_cast<size_t>(i));
    } catch (const c10::Error& e) {
      // Keep the exception's class (TypeError stays TypeError) and name the item.
      if (dynamic_cast<const c10::TypeError*>(&e)) TORCH_CHECK_TYPE(false, "pinstage.stage_many: item ", i, ": ", e.what_without_backtrace());
      if (dynamic_cast<const c10::ValueError*>(&e)) TORCH_CHECK_VALUE(false, "pinstage.stage_many: item ", i, ": ", e.what_without_backtrace());
      throw;
    }
  }

  std::vector<at::Tensor> results;
  results.reserve(plans.size());
  if (!target.cuda) {
    for (size_t i = 0; i < plans.size(); ++i) {
      try {
        results.push_back(stage_on_cpu(plans[i]));
      } catch (py::error_already_set& e) {
        rethrow_for_item(e, i);
      }
    }
    return results;
  }
#ifdef PINSTAGE_WITH_CUDA
  std::vector<ItemLayout> layouts;
  layouts.reserve(plans.size());
  for (const ItemPlan& plan : plans) layouts.push_back({plan.dtype, plan.shape, plan.nbytes});
  return stage_in_one_copy(target, layouts, [&](size_t i, uint8_t* dst) {
    try {
      write_item(plans[i], dst);
    } catch (py::error_already_set& e) {
      rethrow_for_item(e, i);  // the lease guard gives the region back
    }
    return plans[i].via_fallback;
  });
#else
  TORCH_INTERNAL_ASSERT(false, "unreachable: CUDA target in a CPU-only build");
#endif
}

namespace {

// stage_into writes into `out` only after every conversion is done, and checks `out` again right
// before the write with no Python code in between: the conversion can run Python code (an
// element's __index__, the torch.tensor fallback, another thread while on_full="wait" waits) that
// replaces out's storage, dtype or device.
void check_out_unchanged(const at::Tensor& out, c10::ScalarType dtype, c10::Device device, int64_t numel) {
  TORCH_CHECK(out.scalar_type() == dtype && out.device() == device && out.is_contiguous() && out.numel() == numel,
              "pinstage.stage_into: out changed while data was being converted (it is now ", dtype_name(out.scalar_type()),
              " of shape ", out.sizes(), " on ", out.device(), "; it was ", dtype_name(dtype), " with ", numel,
              " elements on ", device, "); nothing was written");
}

}  // namespace

void stage_into(PyObject* data, PyObject* out_obj, PyObject* stream) {
  ProfilerRange range("pinstage::stage_into");
  TORCH_CHECK_TYPE(is_tensor(out_obj), "pinstage.stage_into: out must be a torch.Tensor, got ", Py_TYPE(out_obj)->tp_name);
  // The variable's own tensor (not a copy): a later `out.data = ...` shows through it.
  const at::Tensor& out = THPVariable_Unpack(out_obj);
  const c10::ScalarType dtype = out.scalar_type();
  const c10::Device device = out.device();
  TORCH_CHECK_TYPE(is_supported_dtype(dtype), "pinstage.stage_into: out has unsupported dtype ",
                   py::str(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))).cast<std::string>());
  TORCH_CHECK_VALUE(out.is_contiguous(), "pinstage.stage_into: out must be contiguous");
  const int64_t out_numel = out.numel();
#ifdef PINSTAGE_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> s;
  if (device.is_cuda()) {
    s = c10::cuda::getCurrentCUDAStream(device.index());
    if (stream != Py_None) {
      const Target target = resolve_target(stream, Py_None);
      TORCH_CHECK_VALUE(target.index == device.index(), "pinstage.stage_into: stream is on cuda:",
                        static_cast<int>(target.index), " but out is on ", device.str());
      s = *target.stream;
    }
    check_not_capturing(*s, "stage_into");
  }
#endif
  ItemPlan plan = plan_item(data, dtype);
  TORCH_CHECK_VALUE(plan.numel == out_numel, "pinstage.stage_into: data has ", plan.numel, " elements (shape ",
                    c10::IntArrayRef(plan.shape), ") but out has ", out_numel, " (shape ", out.sizes(), ")");
  if (device.is_cpu()) {
    TORCH_CHECK_VALUE(stream == Py_None, "pinstage.stage_into: out is on the CPU; no stream applies");
    // Through a temporary: a bad element must leave out as it was.
    at::Tensor values = stage_on_cpu(plan);
    check_out_unchanged(out, dtype, device, plan.numel);
    if (plan.nbytes > 0) std::memcpy(out.data_ptr(), values.data_ptr(), plan.nbytes);
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  TORCH_CHECK_VALUE(device.is_cuda(), "pinstage.stage_into: out must be on the CPU or a CUDA device, got ", device.str());
  c10::cuda::CUDAGuard device_guard(device.index());
  StagingRing& ring = ring_for(device.index());
  if (plan.nbytes == 0) {
    write_item(plan, nullptr);
    count(ring, 0, plan.via_fallback);
    return;
  }
  LeaseGuard lease(ring, plan.nbytes);
  write_item(plan, lease.data());
  check_out_unchanged(out, dtype, device, plan.numel);
  lease.copy_and_commit(out.data_ptr(), plan.nbytes, *s);
  count(ring, plan.nbytes, plan.via_fallback);
#else
  TORCH_CHECK_VALUE(false, "pinstage.stage_into: out is on ", device.str(), " but pinstage was built without CUDA");
#endif
}

}  // namespace pinstage
