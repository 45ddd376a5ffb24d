// LeaseGuard: ring memory for one call's copies, handed back on every path. Until commit() it is
// abandoned by the destructor (an exception between reserve and copy: bad input, out of device
// memory); from commit() on it belongs to the ring, sealed even when commit throws.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <Python.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <utility>

#include "python/py_objects.h"
#include "ring/pinned_memory.h"
#include "ring/staging_ring.h"

namespace pinstage {

class LeaseGuard {
 public:
  // Under on_full="wait" this may wait for an enqueued copy, with the GIL released when the caller
  // holds it (a torch op runs without it), so that other Python threads run meanwhile.
  LeaseGuard(StagingRing& ring, size_t bytes) : ring_(ring) {
    for (;;) {
      StagingRing::Acquired got = ring.try_acquire(bytes);
      if (got.lease) {
        lease_ = *got.lease;
        return;
      }
      std::optional<GilReleased> no_gil;
      if (PyGILState_Check()) no_gil.emplace();
      ring.wait_for(got.wait_on);
    }
  }
  ~LeaseGuard() {
    if (lease_.data != nullptr) ring_.abandon(lease_);
  }
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

  uint8_t* data() const { return lease_.data; }

  // The copies that use the lease are enqueued on `stream`: the ring owns it from now on (held:
  // until StagingRing::unhold). Returns the committed lease and its fence.
  std::pair<HostLease, StreamFence*> commit(cudaStream_t stream, bool held = false) {
    const HostLease committed = lease_;
    lease_ = HostLease{};
    HostLease handed = committed;
    StreamFence* fence = ring_.commit(handed, stream, held);
    return {committed, fence};
  }

  // One host-to-device copy of the lease's first `bytes` into `dst` on `stream`, then commit.
  void copy_and_commit(void* dst, size_t bytes, cudaStream_t stream) {
    copy_async(dst, lease_.data, bytes, cudaMemcpyHostToDevice, stream);
    commit(stream);
  }

 private:
  StagingRing& ring_;
  HostLease lease_;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
