// Copies through the ring: copy_through_ring, the one host-to-device path (below), and LeaseGuard,
// ring memory for one call's copies, handed back on every path, in both directions.
// Until a copy that reads or writes it is enqueued, the destructor abandons it (an exception between
// reserve and copy: bad input, out of device memory); from the first enqueued copy on it belongs
// to the ring, sealed behind that copy's stream even when the call fails later.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <Python.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <utility>

#include "python/py_objects.h"
#include "ring/pinned_memory.h"
#include "ring/registry.h"
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
      GilReleasedIfHeld no_gil;
      ring.wait_for(got.wait_on, "pinstage: on_full=\"wait\" must wait for an in-flight copy (the ring is full)");
    }
  }
  ~LeaseGuard() {
    if (lease_.data == nullptr) return;
    if (!enqueued_on_) {
      ring_.abandon(lease_);
      return;
    }
    // A copy uses the region: it may only be reused behind that copy. commit() seals it before
    // anything that can fail, so an error recording the fence loses nothing but the fence.
    try {
      ring_.commit(lease_, *enqueued_on_);
    } catch (...) {
    }
  }
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

  uint8_t* data() const { return lease_.data; }

  // cudaMemcpyAsync between the lease and device memory on `stream`; the lease is then the
  // ring's whatever happens (see the destructor). Every copy of one lease uses one stream.
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    copy_async(dst, src, bytes, kind, stream);
    enqueued_on_ = stream;
  }

  // A kernel that reads the lease was launched on `stream`, or its launch failed (it then reads
  // nothing, and the region waits only for the work already on the stream).
  void launched(cudaStream_t stream) { enqueued_on_ = stream; }

  // The copies that use the lease are enqueued on `stream`: the ring owns it from now on (held:
  // until StagingRing::unhold). Returns the committed lease and its fence.
  std::pair<HostLease, StreamFence*> commit(cudaStream_t stream, bool held = false) {
    const HostLease committed = lease_;
    lease_ = HostLease{};
    HostLease handed = committed;
    StreamFence* fence = ring_.commit(handed, stream, held);
    return {committed, fence};
  }

 private:
  StagingRing& ring_;
  HostLease lease_;
  std::optional<cudaStream_t> enqueued_on_;
};

// The one host-to-device path through the staging ring: `write(region)` fills `bytes` of ring
// memory (region is null when bytes is 0: it only validates) and returns how many items fell
// back to torch.tensor; then `destination()` gives the device memory (it may allocate it, or
// check that it is still there: no Python code runs between it and the copy); then ONE copy on
// `stream`, or what `enqueue(lease, destination)` enqueues there in its place (one kernel that
// copies and does more: stage_prefill), the commit and the counters. The caller holds a device
// guard for `device`.
template <class Write, class Destination, class Enqueue>
void through_ring(c10::DeviceIndex device, size_t bytes, cudaStream_t stream, Write&& write, Destination&& destination,
                  Enqueue&& enqueue) {
  StagingRing& ring = ring_for(device, Direction::kToDevice);
  if (bytes == 0) {
    const size_t fallbacks = write(nullptr);
    destination();
    ring.counters().record(0, 0, fallbacks);
    return;
  }
  LeaseGuard lease(ring, bytes);
  const size_t fallbacks = write(lease.data());
  void* const dst = destination();
  enqueue(lease, dst);
  lease.commit(stream);
  ring.counters().record(bytes, 1, fallbacks);
}

template <class Write, class Destination>
void copy_through_ring(c10::DeviceIndex device, size_t bytes, cudaStream_t stream, Write&& write,
                       Destination&& destination) {
  through_ring(
      device, bytes, stream, std::forward<Write>(write), std::forward<Destination>(destination),
      [&](LeaseGuard& lease, void* dst) { lease.copy(dst, lease.data(), bytes, cudaMemcpyHostToDevice, stream); });
}

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
