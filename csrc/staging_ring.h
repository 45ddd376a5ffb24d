// StagingRing: one device's pinned staging memory. A slab (allocated on first use) carved by a
// RingAllocator whose fences are CUDA events recorded behind the copies that read it (shared by
// consecutive copies on a stream, see stream_fence.h), plus an OverflowPool for what the slab
// cannot hold. Thread-safe.
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

#include "event_pool.h"
#include "overflow_pool.h"
#include "ring_allocator.h"
#include "staging_options.h"
#include "stream_fence.h"

namespace pinstage {

// Where one staging call writes its host bytes. Obtained from StagingRing::try_acquire and handed
// back exactly once, by commit (a copy reads it) or abandon (nothing does).
struct HostLease {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  struct Slab* slab = nullptr;  // set when the bytes are in the ring
  uint64_t ticket = 0;
  OverflowPool::Block block;  // set when the bytes are in an overflow block
};

struct Slab {
  uint8_t* base = nullptr;
  RingAllocator<StreamFence*> ring;
  explicit Slab(size_t capacity) : ring(capacity) {}
};

struct RingCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes_staged{0};
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> fallbacks{0};
};

class StagingRing {
 public:
  StagingRing(c10::DeviceIndex device, size_t capacity, OnFull on_full);
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Host memory for `bytes` (> 0) that no in-flight copy reads. Never blocks. Returns nullopt only
  // when on_full is kWait and the ring has no room yet: call wait_for_oldest() and try again.
  // Throws when on_full is kError and there is no room.
  std::optional<HostLease> try_acquire(size_t bytes);

  // Blocks until the oldest in-flight region's copy has completed (on_full == kWait only).
  void wait_for_oldest();

  // The copy that reads `lease` is enqueued on `stream`; records the fence behind it.
  void commit(HostLease& lease, cudaStream_t stream);
  void abandon(HostLease& lease);

  void set_options(std::optional<size_t> capacity, std::optional<OnFull> on_full);
  OnFull on_full() const { return on_full_.load(std::memory_order_relaxed); }

  RingCounters& counters() { return counters_; }

  struct Snapshot {
    size_t ring_bytes, in_flight_bytes, peak_in_flight_bytes, pending_regions;
    bool allocated;
    uint64_t overflows, waits, wraps, events_created;
    size_t overflow_reserved_bytes, overflow_in_flight_bytes;
  };
  Snapshot snapshot();

 private:
  void release_completed_locked();
  void retire_slab_locked();
  void free_drained_slabs_locked();

  const c10::DeviceIndex device_;
  std::mutex mu_;
  std::unique_ptr<Slab> slab_;                     // the live slab; base allocated lazily
  size_t capacity_;
  std::vector<std::unique_ptr<Slab>> retired_;     // resized away, freed once their copies are done
  std::atomic<OnFull> on_full_;
  EventPool events_;
  StreamFences fences_{events_};
  OverflowPool overflow_;
  size_t reclaim_at_;  // reclaim when this many regions are pending (backs off while none complete)
  uint64_t overflows_ = 0;
  uint64_t waits_ = 0;
  uint64_t wraps_retired_ = 0;
  size_t peak_retired_ = 0;
  RingCounters counters_;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
