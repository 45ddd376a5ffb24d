#include "stage/fetch.h"

#include <ATen/ops/from_blob.h>

#include "ring/options.h"
#include "ring/registry.h"
#include "stage/target.h"

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace pinstage {

struct FetchHandle::Region {
#ifdef PINSTAGE_WITH_CUDA
  StagingRing* ring = nullptr;
  HostLease lease;
  StreamFence* fence = nullptr;
  ~Region() {
    if (ring == nullptr) return;
    try {
      ring->unhold(lease);
    } catch (...) {  // a destructor must not throw; the region then stays held (safe, never reused)
    }
  }
#endif
};

std::shared_ptr<FetchHandle> FetchHandle::start(const std::vector<at::Tensor>& tensors, PyObject* stream,
                                                const char* api) {
  auto handle = std::make_shared<FetchHandle>();
  TORCH_CHECK_VALUE(!tensors.empty(), "pinstage.", api, ": nothing to fetch");
  const c10::Device device = tensors[0].device();
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK_VALUE(t.device() == device, "pinstage.", api, ": the tensors are on ", device, " and ", t.device(),
                      "; one fetch copies from one device");
    TORCH_CHECK_TYPE(t.layout() == c10::kStrided, "pinstage.", api, ": a ", t.layout(), " tensor cannot be fetched");
    handle->shapes_.emplace_back(t.sizes().begin(), t.sizes().end());
    handle->dtypes_.push_back(t.scalar_type());
  }
  if (device.is_cpu()) {
    TORCH_CHECK_VALUE(stream == Py_None, "pinstage.", api, ": the tensors are on the CPU; no stream applies");
    for (const at::Tensor& t : tensors) handle->host_.push_back(t.detach().clone(at::MemoryFormat::Contiguous));
    return handle;
  }
  TORCH_CHECK_VALUE(device.is_cuda(), "pinstage.", api, ": the tensors are on ", device, "; CUDA or CPU only");
#ifdef PINSTAGE_WITH_CUDA
  const c10::cuda::CUDAStream s = stream_on(stream, device.index(), api);
  check_not_capturing(s, api);
  c10::cuda::CUDAGuard device_guard(device.index());
  std::vector<at::Tensor> sources;
  size_t total = 0;
  for (const at::Tensor& t : tensors) {
    // A strided tensor is made contiguous by a kernel on the copy's stream, before the copy.
    c10::cuda::CUDAStreamGuard stream_guard(s);
    sources.push_back(t.is_contiguous() ? t : t.contiguous());
    handle->offsets_.push_back(align_up(total, kStagingAlignment));
    total = handle->offsets_.back() + sources.back().nbytes();
  }
  StagingRing& ring = ring_for(device.index(), Direction::kToHost);
  auto region = std::make_shared<Region>();
  for (;;) {
    if (auto lease = ring.try_acquire(std::max<size_t>(total, 1))) {
      region->lease = *lease;
      break;
    }
    ring.wait_for_oldest();  // on_full="wait" (the GIL is held: a fetch is short)
  }
  size_t copies = 0;
  try {
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].nbytes() == 0) continue;
      copy_async(region->lease.data + handle->offsets_[i], sources[i].const_data_ptr(), sources[i].nbytes(),
                 cudaMemcpyDeviceToHost, s.stream());
      ++copies;
      // The source may be freed once this call returns: its memory must not be reused by its own
      // stream before the copy on `s` has read it.
      c10::cuda::CUDACachingAllocator::recordStream(sources[i].storage().data_ptr(), s);
    }
  } catch (...) {
    if (copies == 0) {
      ring.abandon(region->lease);
      throw;
    }
    // A copy is enqueued: the region may only be given back behind its fence.
    region->fence = ring.commit(region->lease, s.stream(), /*held=*/false);
    region->lease = HostLease{};
    throw;
  }
  region->fence = ring.commit(region->lease, s.stream(), /*held=*/true);
  region->ring = &ring;
  ring.counters().record(total, copies, 0);
  handle->region_ = std::move(region);
  return handle;
#else
  built_without_cuda(device);
#endif
}

FetchHandle::~FetchHandle() { release(); }

void FetchHandle::release() {
  released_ = true;
  region_.reset();
  host_.clear();
}

void FetchHandle::check_not_released() const {
  TORCH_CHECK(!released_, "pinstage.FetchHandle: the handle was released; its memory may hold other values now");
}

bool FetchHandle::ready() {
  check_not_released();
  if (!host_.empty()) return true;
#ifdef PINSTAGE_WITH_CUDA
  return region_->ring->fence_done(region_->fence);
#else
  return true;
#endif
}

void FetchHandle::wait() {
  check_not_released();
  if (!host_.empty()) return;
#ifdef PINSTAGE_WITH_CUDA
  if (region_->ring->fence_done(region_->fence)) return;
  const auto mode = c10::cuda::warning_state().get_sync_debug_mode();
  TORCH_CHECK(mode != c10::cuda::SyncDebugMode::L_ERROR,
              "pinstage.FetchHandle.wait: waiting for a copy is a synchronisation, and synchronisation is an error "
              "here (torch.cuda.set_sync_debug_mode / pinstage.testing.no_sync); check ready() instead");
  if (mode == c10::cuda::SyncDebugMode::L_WARN) TORCH_WARN("pinstage.FetchHandle.wait: waiting for a copy");
  const cudaEvent_t event = region_->ring->fence_event(region_->fence);
  C10_CUDA_CHECK(cudaEventSynchronize(event));
#endif
}

std::vector<at::Tensor> FetchHandle::tensors() {
  check_not_released();
  if (!host_.empty()) return host_;
  wait();
  std::vector<at::Tensor> out;
#ifdef PINSTAGE_WITH_CUDA
  for (size_t i = 0; i < shapes_.size(); ++i) {
    // Each view holds the region: released (for reuse) only when the handle and every view are gone.
    std::shared_ptr<Region> hold = region_;
    out.push_back(at::from_blob(region_->lease.data + offsets_[i], shapes_[i], [hold](void*) mutable { hold.reset(); },
                                at::TensorOptions().dtype(dtypes_[i])));
  }
#endif
  return out;
}

}  // namespace pinstage
