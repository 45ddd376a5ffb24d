// StagingRing: one device's pinned memory for copies in one direction. A slab (allocated on first
// use) carved by a RingAllocator whose fences are CUDA events recorded behind the copies that use
// it (shared by consecutive copies on a stream, see stream_fence.h), plus an OverflowPool for what
// the slab cannot hold. Each device has one for stagings (host to device) and one for fetches
// (device to host, whose regions are also held until the host is done reading them). Thread-safe.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ring/counters.h"
#include "ring/event_pool.h"
#include "ring/options.h"
#include "ring/overflow_pool.h"
#include "ring/ring_allocator.h"
#include "ring/stream_fence.h"

namespace pinstage {

struct Slab {
  uint8_t* base = nullptr;
  RingAllocator<StreamFence*> ring;
  explicit Slab(size_t capacity) : ring(capacity) {}
};

// Where one copy's host bytes are. Obtained from StagingRing::try_acquire and handed back exactly
// once, by commit (a copy uses it) or abandon (nothing does).
struct HostLease {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  Slab* slab = nullptr;  // set when the bytes are in the ring
  uint64_t ticket = 0;
  OverflowPool::Block block;  // set when the bytes are in an overflow block
};

class StagingRing {
 public:
  StagingRing(c10::DeviceIndex device, size_t capacity, OnFull on_full);
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Host memory for `bytes` (> 0) that no copy in flight uses. Never blocks. Returns nullopt only
  // when on_full is kWait and the ring has no room yet: call wait_for_oldest() and try again.
  // Throws RingFullError when on_full is kError and there is no room.
  std::optional<HostLease> try_acquire(size_t bytes);

  // Blocks until the oldest region's copy has completed (on_full == kWait only).
  void wait_for_oldest();

  // The copy that uses `lease` is enqueued on `stream`; its fence is recorded behind it. A `held`
  // lease is also kept until unhold(); its fence is recorded at once and stays valid until then.
  StreamFence* commit(HostLease& lease, cudaStream_t stream, bool held = false);
  void abandon(HostLease& lease);
  void unhold(const HostLease& committed);

  // For a held lease's fence: has its copy completed (no waiting), and the event to wait on.
  bool fence_done(StreamFence* fence);
  cudaEvent_t fence_event(StreamFence* fence);

  void set_options(std::optional<size_t> capacity, std::optional<OnFull> on_full);
  OnFull on_full() const { return on_full_.load(std::memory_order_relaxed); }

  // Frees retired slabs and spare overflow blocks whose copies have completed. May synchronise the
  // device (cudaFreeHost): for configure() and empty_cache() only.
  void free_unused();

  StagingCounters& counters() { return counters_; }

  struct Snapshot {
    size_t ring_bytes, in_flight_bytes, peak_in_flight_bytes, pending_regions;
    bool allocated;
    uint64_t overflows, waits, wraps, events_created;
    size_t overflow_reserved_bytes, overflow_peak_reserved_bytes, overflow_in_flight_bytes;
  };
  Snapshot snapshot();

 private:
  void release_completed_locked();
  void retire_slab_locked();

  const c10::DeviceIndex device_;
  std::mutex mu_;
  std::unique_ptr<Slab> slab_;                  // the live slab; base allocated lazily
  size_t capacity_;
  std::vector<std::unique_ptr<Slab>> retired_;  // resized away, freed once nothing uses them
  std::atomic<OnFull> on_full_;
  EventPool events_;
  StreamFences fences_{events_};
  OverflowPool overflow_;
  size_t reclaim_at_;  // reclaim when this many regions are pending (backs off while none complete)
  uint64_t overflows_ = 0;
  uint64_t waits_ = 0;
  uint64_t wraps_retired_ = 0;
  size_t peak_retired_ = 0;
  StagingCounters counters_;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
