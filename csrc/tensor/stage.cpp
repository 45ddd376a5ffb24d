#include "tensor/stage.h"

#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <cstring>
#include <string>

#include "convert/dtypes.h"
#include "convert/item_plan.h"
#include "convert/tensor_memory.h"
#include "copy/ring_copy.h"
#include "copy/target.h"
#include "python/error_prefix.h"
#include "python/py_objects.h"
#include "ring/registry.h"

#ifdef PINSTAGE_WITH_CUDA
#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#endif

namespace pinstage {
namespace {

// The most one staging can hold: the largest storage torch can describe.
constexpr size_t kMaxStagingBytes = static_cast<size_t>(INT64_MAX);

// Runs fn(); an error it raises names item `i` of the call `pinstage.<api>` (none where api is null),
// keeping its exception type.
template <class Fn>
auto for_item(size_t i, const char* api, Fn&& fn) -> decltype(fn()) {
  if (api == nullptr) return fn();
  return with_error_prefix([i, api] { return std::string("pinstage.") + api + ": item " + std::to_string(i); },
                           std::forward<Fn>(fn));
}

#ifdef PINSTAGE_WITH_CUDA

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

// A tensor of `dtype` and `shape` over `buffer`'s storage at `byte_offset`: a view made without
// the dispatcher (stage_many returns several per call).
at::Tensor typed_view(const at::Tensor& buffer, size_t byte_offset, c10::ScalarType dtype, at::IntArrayRef shape) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()), buffer.key_set(),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_storage_offset(static_cast<int64_t>(byte_offset / c10::elementSize(dtype)));
  impl->set_sizes_contiguous(shape);
  return at::Tensor(std::move(impl));
}

// Every plan in one ring region (each at an aligned offset), one device allocation mirroring that
// layout, ONE copy (or `kernel`, its part of the region after the plans'), and a view of it per
// plan; a single plan gets an allocation of its own dtype.
std::vector<at::Tensor> stage_on_device(std::vector<ItemPlan>& plans, const Target& target, const char* item_api,
                                        const KernelForCopy* kernel) {
  const c10::cuda::CUDAStream& stream = *target.stream;
  check_not_capturing(stream, item_api ? item_api : "stage_to_device");
  // Not skipped when the target is the current device: Python code run by a conversion (the
  // fallback, an element's __index__) may change the current device before the allocation.
  c10::cuda::CUDAGuard device_guard(target.device.index());
  c10::SmallVector<size_t, 16> offsets(plans.size());  // no heap allocation for a short call
  size_t total = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    // Each item's bytes fit int64 (checked_nbytes); their sum may not.
    TORCH_CHECK(plans[i].nbytes <= kMaxStagingBytes - kStagingAlignment &&
                    total <= kMaxStagingBytes - kStagingAlignment - plans[i].nbytes,
                "pinstage: the items together are more than 2**63 bytes");
    offsets[i] = align_up(total, kStagingAlignment);
    total = offsets[i] + plans[i].nbytes;
  }
  size_t own = total;  // the kernel's part of the region
  if (kernel) {
    own = align_up(total, kStagingAlignment);
    TORCH_CHECK(kernel->ring_bytes <= kMaxStagingBytes - own, "pinstage: the items together are more than 2**63 bytes");
  }
  const size_t region_bytes = kernel ? own + kernel->ring_bytes : total;
  const bool single = plans.size() == 1 && !kernel;
  at::Tensor buffer;
  auto write = [&](uint8_t* region) {
    size_t fallbacks = 0;
    for (size_t i = 0; i < plans.size(); ++i) {
      uint8_t* dst = plans[i].nbytes > 0 ? region + offsets[i] : nullptr;
      for_item(i, item_api, [&] { write_item(plans[i], dst); });
      fallbacks += plans[i].via_fallback ? 1 : 0;  // when planned or when written, as stage_on_cpu counts
    }
    return fallbacks;
  };
  auto allocate = [&]() -> void* {
    buffer = single ? empty_on_stream(plans[0].shape, plans[0].dtype, stream)
                    : empty_on_stream({static_cast<int64_t>(total)}, c10::ScalarType::Byte, stream);
    return buffer.data_ptr();
  };
  if (kernel) {
    through_ring(target.device.index(), region_bytes, stream.stream(), write, allocate,
                 [&](LeaseGuard& lease, void* dst) {
                   const int launched =
                       kernel->launch(lease.data(), offsets.data(), total, dst, lease.data() + own, stream.stream());
                   lease.launched(stream.stream());
                   C10_CUDA_CHECK(static_cast<cudaError_t>(launched));
                 });
  } else {
    copy_through_ring(target.device.index(), total, stream.stream(), write, allocate);
  }
  if (single) return {std::move(buffer)};
  std::vector<at::Tensor> results;
  results.reserve(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    results.push_back(typed_view(buffer, offsets[i], plans[i].dtype, plans[i].shape));
  }
  return results;
}

#endif  // PINSTAGE_WITH_CUDA

std::vector<at::Tensor> stage_on_cpu(std::vector<ItemPlan>& plans, const char* item_api) {
  std::vector<at::Tensor> results;
  results.reserve(plans.size());
  size_t bytes = 0;
  size_t fallbacks = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    results.push_back(for_item(i, item_api, [&] { return cpu_values(plans[i]); }));
    bytes += plans[i].nbytes;
    fallbacks += plans[i].via_fallback ? 1 : 0;
  }
  cpu_counters().record(bytes, 0, fallbacks);
  return results;
}

// stage_into writes into `out` only after every conversion is done, and checks `out` again right
// before the write with no Python code in between: the conversion can run Python code (an
// element's __index__, the torch.tensor fallback, another thread while on_full="wait" waits) that
// replaces out's storage, dtype or device.
void check_out_unchanged(const at::Tensor& out, c10::ScalarType dtype, c10::Device device, int64_t numel) {
  TORCH_CHECK(out.scalar_type() == dtype && out.device() == device && out.is_contiguous() && out.numel() == numel &&
                  has_real_memory(out),
              "pinstage.stage_into: out changed while data was being converted (it is now ",
              dtype_name(out.scalar_type()), " of shape ", out.sizes(), " on ", out.device(), "; it was ",
              dtype_name(dtype), " with ", numel, " elements on ", device,
              ", or its storage no longer holds it); "
              "nothing was written");
}

}  // namespace

std::vector<at::Tensor> stage_plans(std::vector<ItemPlan>& plans, const Target& target, const char* item_api,
                                    const KernelForCopy* kernel) {
  if (target.device.is_cpu()) {
    TORCH_CHECK(kernel == nullptr, "pinstage: internal error: a kernel in place of a copy on the CPU");
    return stage_on_cpu(plans, item_api);
  }
#ifdef PINSTAGE_WITH_CUDA
  return stage_on_device(plans, target, item_api, kernel);
#else
  built_without_cuda(target.device);
#endif
}

at::Tensor stage_to_device(PyObject* data, PyObject* dtype_obj, PyObject* stream, PyObject* device) {
  RECORD_USER_SCOPE("pinstage::stage_to_device");  // a range in the torch profiler
  const c10::ScalarType dtype = parse_dtype(dtype_obj, "dtype");
  const Target target = resolve_target(stream, device);
  std::vector<ItemPlan> plans;
  plans.push_back(plan_item(data, dtype));
  return stage_plans(plans, target, nullptr)[0];
}

void check_items_sequence(PyObject* items, const char* api) {
  TORCH_CHECK_TYPE(PySequence_Check(items), "pinstage.", api, ": items must be a sequence of (data, dtype) pairs, got ",
                   Py_TYPE(items)->tp_name);
}

std::vector<ItemPlan> plan_many(PyObject* items, const char* api, std::vector<THPObjectPtr>& held) {
  // Python code can run between planning and writing (the torch.tensor fallback; other threads
  // while on_full="wait" waits) and must not be able to free what the plans point at: each item's
  // data is held as soon as it is read. A list is read in place, not copied: Python code run by an
  // item may mutate it, so its length is checked before each item is read, and a pair is read
  // before any Python code runs for it.
  THPObjectPtr seq(checked(PySequence_Fast(items, "items must be a sequence")));  // callers ran check_items_sequence
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
  held.reserve(held.size() + static_cast<size_t>(n));
  std::vector<ItemPlan> plans;
  plans.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(PySequence_Fast_GET_SIZE(seq.get()) == n, "pinstage.", api, ": items changed length from ", n,
                      " to ", PySequence_Fast_GET_SIZE(seq.get()), " while item ", i - 1,
                      " was converted (Python code it ran mutated the list); nothing was staged");
    PyObject* pair = PySequence_Fast_GET_ITEM(seq.get(), i);
    TORCH_CHECK_TYPE((PyTuple_Check(pair) || PyList_Check(pair)) && PySequence_Fast_GET_SIZE(pair) == 2, "pinstage.",
                     api, ": item ", i, " must be a (data, dtype) pair, got ", Py_TYPE(pair)->tp_name);
    PyObject** fields = PySequence_Fast_ITEMS(pair);
    held.push_back(THPObjectPtr::dup(fields[0]));
    PyObject* dtype = fields[1];
    plans.push_back(for_item(static_cast<size_t>(i), api,
                             [&] { return plan_source(held.back().get(), parse_dtype(dtype, "dtype")); }));
    finish_plan_in_order(plans, [api](size_t k, auto&& fn) { for_item(k, api, fn); });
  }
  return plans;
}

std::vector<at::Tensor> stage_many(PyObject* items, PyObject* stream, PyObject* device) {
  RECORD_USER_SCOPE("pinstage::stage_many");  // a range in the torch profiler
  constexpr const char* kApi = "stage_many";  // messages add "pinstage."
  check_items_sequence(items, kApi);
  const Target target = resolve_target(stream, device);
  std::vector<THPObjectPtr> held;
  std::vector<ItemPlan> plans = plan_many(items, kApi, held);
  return stage_plans(plans, target, kApi);
}

void stage_into(PyObject* data, PyObject* out_obj, PyObject* stream) {
  RECORD_USER_SCOPE("pinstage::stage_into");  // a range in the torch profiler
  TORCH_CHECK_TYPE(is_tensor(out_obj), "pinstage.stage_into: out must be a torch.Tensor, got ",
                   Py_TYPE(out_obj)->tp_name);
  // The variable's own tensor (not a copy): a later `out.data = ...` shows through it.
  const at::Tensor& out = unpack_tensor(out_obj);
  const c10::ScalarType dtype = out.scalar_type();
  const c10::Device device = out.device();
  TORCH_CHECK_TYPE(is_supported_dtype(dtype), "pinstage.stage_into: out has unsupported dtype ", dtype_name(dtype));
  TORCH_CHECK_TYPE(has_real_memory(out),
                   "pinstage.stage_into: out must be a dense tensor whose storage holds its "
                   "values; got a ",
                   Py_TYPE(out_obj)->tp_name,
                   " without one (a tensor subclass, FakeTensor, zero, "
                   "nested or quantized tensor)");
  // A neg view's storage holds the negated values: bytes written there would read back negated.
  TORCH_CHECK_VALUE(!out.is_neg(),
                    "pinstage.stage_into: out is a negative view (_neg_view()); its storage holds "
                    "the negated values, so pass the tensor it views, or a resolved copy (resolve_neg())");
  TORCH_CHECK_VALUE(out.is_contiguous(), "pinstage.stage_into: out must be contiguous");
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(),
                    "pinstage.stage_into: out must be on the CPU or a CUDA device, got ", device.str());
  const int64_t out_numel = out.numel();
  [[maybe_unused]] const Target target = target_on(device, stream, "stage_into");  // no stream on the CPU
  ItemPlan plan = plan_item(data, dtype);
  TORCH_CHECK_VALUE(plan.numel == out_numel, "pinstage.stage_into: data has ", plan.numel, " elements (shape ",
                    c10::IntArrayRef(plan.shape), ") but out has ", out_numel, " (shape ", out.sizes(), ")");
  if (device.is_cpu()) {
    // Through a temporary: a bad element must leave out as it was.
    std::vector<ItemPlan> plans;
    plans.push_back(std::move(plan));
    const at::Tensor values = stage_on_cpu(plans, nullptr)[0];
    check_out_unchanged(out, dtype, device, out_numel);
    if (plans[0].nbytes > 0) std::memcpy(out.data_ptr(), values.const_data_ptr(), plans[0].nbytes);
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  c10::cuda::CUDAGuard device_guard(device.index());
  copy_through_ring(
      device.index(), plan.nbytes, target.stream->stream(),
      [&](uint8_t* region) -> size_t {
        write_item(plan, region);
        return plan.via_fallback ? 1 : 0;  // when planned or when written, as stage_many counts
      },
      [&]() -> void* {
        check_out_unchanged(out, dtype, device, out_numel);
        return out.data_ptr();
      });
#endif
}

}  // namespace pinstage
