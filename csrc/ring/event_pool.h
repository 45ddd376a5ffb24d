// A per-device pool of CUDA events (see Note [Ring design] in ring/staging_ring.h). Not
// thread-safe: the StagingRing that owns it serialises access.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace pinstage {

class EventPool {
 public:
  explicit EventPool(c10::DeviceIndex device) : device_(device) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  // Events are never destroyed: a pool lives as long as the process (see registry.cpp).

  cudaEvent_t acquire() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    c10::cuda::CUDAGuard guard(device_);  // an event belongs to the device current at creation
    cudaEvent_t e;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ++created_;
    return e;
  }

  void release(cudaEvent_t e) { free_.push_back(e); }

  uint64_t created() const { return created_; }

 private:
  c10::DeviceIndex device_;
  std::vector<cudaEvent_t> free_;
  uint64_t created_ = 0;
};

// Non-blocking completion test: true when everything enqueued before the event has run.
inline bool event_done(cudaEvent_t e) {
  const cudaError_t status = cudaEventQuery(e);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // NotReady is sticky in the last-error slot; don't leak it to others
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
