// LeaseGuard: a staging ring lease that is given back unless the copy that uses it was committed.
// Every host-to-device staging (stage_to_device, stage_many, stage_into, StaticInputs) takes its
// ring region through one.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/cuda/CUDAStream.h>

#include "python/py_objects.h"
#include "ring/pinned_memory.h"
#include "ring/staging_ring.h"

namespace pinstage {

// An exception between reserve and copy (bad input, out of device memory) must not leave a region
// held forever.
class LeaseGuard {
 public:
  LeaseGuard(StagingRing& ring, size_t bytes) : ring_(ring) {
    for (;;) {
      if (auto lease = ring.try_acquire(bytes)) {
        lease_ = *lease;
        return;
      }
      GilReleased no_gil;  // on_full="wait": let other Python threads run meanwhile
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
    copy_async(dst, lease_.data, bytes, cudaMemcpyHostToDevice, stream.stream());
    HostLease enqueued = lease_;
    lease_ = HostLease{};
    ring_.commit(enqueued, stream.stream());
  }

 private:
  StagingRing& ring_;
  HostLease lease_;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
