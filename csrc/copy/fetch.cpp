#include "copy/fetch.h"

#include <ATen/ops/from_blob.h>

#include <mutex>
#include <string>
#include <tuple>

#include "convert/tensor_memory.h"
#include "copy/ring_copy.h"
#include "copy/target.h"
#include "ring/options.h"
#include "ring/registry.h"

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
    if (ring != nullptr) ring->unhold(lease);  // cannot fail (see StagingRing::unhold)
  }
#endif
};

namespace {

// Only memory a tensor really has is copied: a tensor subclass that wraps others or a fake tensor
// (a Python dispatch key, often a null data pointer) and an efficient zero tensor have none, and a
// quantized tensor's values mean nothing without its quantizer.
void check_fetchable(const at::Tensor& t, size_t i, const char* api) {
  TORCH_CHECK_TYPE(t.layout() == c10::kStrided && !t.is_nested(), "pinstage.", api, ": tensor ", i, " is a ",
                   t.is_nested() ? std::string("nested") : c10::str(t.layout()),
                   " tensor; only strided tensors can be fetched");
  TORCH_CHECK_TYPE(!t.is_quantized(), "pinstage.", api, ": tensor ", i, " is quantized (", t.scalar_type(),
                   "); fetch its dequantize() or int_repr()");
  TORCH_CHECK_TYPE(has_real_memory(t), "pinstage.", api, ": tensor ", i, " (", t.scalar_type(), " on ", t.device(),
                   ") has no memory of its own to copy (a tensor subclass wrapping others, a fake or zero tensor); "
                   "fetch the tensors it holds");
}

}  // namespace

std::shared_ptr<FetchHandle> FetchHandle::start(const std::vector<at::Tensor>& tensors, PyObject* stream, bool many) {
  const char* api = many ? "fetch_many" : "fetch_to_host";
  auto handle = std::make_shared<FetchHandle>();
  handle->many_ = many;
  TORCH_CHECK_VALUE(!tensors.empty(), "pinstage.", api, ": nothing to fetch");
  const c10::Device device = tensors[0].device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK_VALUE(t.device() == device, "pinstage.", api, ": the tensors are on ", device, " and ", t.device(),
                      "; one fetch copies from one device");
    check_fetchable(t, i, api);
    handle->shapes_.emplace_back(t.sizes().begin(), t.sizes().end());
    handle->dtypes_.push_back(t.scalar_type());
  }
  [[maybe_unused]] const Target target = target_on(device, stream, api);  // no stream on the CPU
  if (device.is_cpu()) {
    for (const at::Tensor& t : tensors) {
      // Resolving a conjugate or negative bit makes a copy of its own: cloned only if still strided.
      const at::Tensor resolved = t.detach().resolve_conj().resolve_neg();
      const bool fresh = t.is_conj() || t.is_neg();
      handle->host_.push_back(fresh && resolved.is_contiguous() ? resolved
                                                                : resolved.clone(at::MemoryFormat::Contiguous));
    }
    return handle;
  }
#ifdef PINSTAGE_WITH_CUDA
  const c10::cuda::CUDAStream s = *target.stream;
  c10::cuda::CUDAGuard device_guard(device.index());
  std::vector<at::Tensor> sources;
  size_t total = 0;
  for (const at::Tensor& t : tensors) {
    if (t.is_conj() || t.is_neg() || !t.is_contiguous()) {
      // Conjugate and negative bits are resolved, and a strided tensor made contiguous, by kernels
      // on the copy's stream before the copy; what they allocate is allocated on that stream.
      c10::cuda::CUDAStreamGuard stream_guard(s);
      at::Tensor source = t.resolve_conj().resolve_neg();
      sources.push_back(source.is_contiguous() ? source : source.contiguous());
    } else {
      sources.push_back(t);
    }
    // The tensor may be freed once this call returns: its memory must not be reused by its own
    // stream before the work on `s` has read it (the copy, or the kernels above).
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s);
    handle->offsets_.push_back(align_up(total, kStagingAlignment));
    total = handle->offsets_.back() + sources.back().nbytes();
  }
  StagingRing& ring = ring_for(device.index(), Direction::kToHost);
  LeaseGuard lease(ring, std::max<size_t>(total, 1));
  size_t copies = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].nbytes() == 0) continue;
    lease.copy(lease.data() + handle->offsets_[i], sources[i].const_data_ptr(), sources[i].nbytes(),
               cudaMemcpyDeviceToHost, s.stream());
    ++copies;
  }
  auto region = std::make_shared<Region>();
  std::tie(region->lease, region->fence) = lease.commit(s.stream(), /*held=*/true);
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
  std::shared_ptr<Region> dropped;  // let go outside the handle's lock
  std::vector<at::Tensor> host;
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    dropped = std::move(region_);
    host = std::move(host_);
  }
}

bool FetchHandle::released() const {
  std::lock_guard<std::mutex> lock(mu_);
  return released_;
}

std::shared_ptr<FetchHandle::Region> FetchHandle::held_region(std::vector<at::Tensor>* host) const {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(!released_, "pinstage.FetchHandle: the handle was released; its memory may hold other values now");
  if (host != nullptr && region_ == nullptr) *host = host_;
  return region_;
}

bool FetchHandle::ready() {
  const std::shared_ptr<Region> region = held_region();
#ifdef PINSTAGE_WITH_CUDA
  if (region != nullptr) return region->ring->fence_done(region->fence);
#endif
  return true;
}

void FetchHandle::wait() {
  // What the wait reads is taken under the handle's lock and kept alive by this reference: a
  // release() from another thread meanwhile cannot pull the region from under it.
  const std::shared_ptr<Region> region = held_region();
#ifdef PINSTAGE_WITH_CUDA
  if (region == nullptr || region->ring->fence_done(region->fence)) return;
  region->ring->wait_for(region->ring->fence_event(region->fence),
                         "pinstage.FetchHandle.wait must wait for the fetch's copy (ready() says when it need not)");
#endif
}

std::vector<at::Tensor> FetchHandle::tensors() {
  std::vector<at::Tensor> host;
  const std::shared_ptr<Region> region = held_region(&host);
  if (region == nullptr) return host;
  wait();
  std::vector<at::Tensor> out;
#ifdef PINSTAGE_WITH_CUDA
  for (size_t i = 0; i < shapes_.size(); ++i) {
    // Each view holds the region: released (for reuse) only when the handle and every view are gone.
    std::shared_ptr<Region> hold = region;
    out.push_back(at::from_blob(
        region->lease.data + offsets_[i], shapes_[i], [hold](void*) mutable { hold.reset(); },
        at::TensorOptions().dtype(dtypes_[i])));
  }
#endif
  return out;
}

}  // namespace pinstage
