// StagingRing: one device's pinned memory for copies in one direction. Thread-safe.
//
// Note [Ring design]
// ~~~~~~~~~~~~~~~~~~
// The one rule: a byte of ring memory is written again by the host only after every copy that read
// it (or wrote it, for fetches) has completed on the device, as shown by a CUDA event recorded
// behind that copy on its stream and queried without blocking. Everything below serves that rule
// without making a staging call wait.
//
// - Allocation (RingAllocator, ring_allocator.h): byte ranges of one pinned slab, first in first
//   out, 16-byte aligned, wrapping to the front. A region is released when it was abandoned (no copy
//   used it) or when its fence is done, its holder (a fetch's reader) let it go, and every older
//   region was released: strictly in order, so a done region behind a pending one stays held
//   (conservative, never unsafe). It knows nothing of CUDA: a fence is anything whose completion can
//   be asked without blocking, so the tests drive it with hand-completed markers.
// - Fences (StreamFence, stream_fence.h): an event recorded on a stream at any time after a copy
//   completes only after that copy, so consecutive copies on a stream share one open fence, recorded
//   after 32 regions, after 1/64 of the ring's bytes (a fence still open when room runs out cannot
//   report completion in time), or when the ring first asks. Most calls record no event.
// - Events (EventPool, event_pool.h): timing disabled, created only while the pool is empty, so none
//   is created in steady state. Completion is queried every 32 regions or when room runs out.
// - A full ring (copies in flight, or a request larger than the ring): on_full="overflow" serves the
//   request from a pinned block (OverflowPool, overflow_pool.h: power-of-two sizes, reused under the
//   same fence rule); "wait" waits for the oldest region's event with the GIL released, but only for
//   a copy already enqueued (an oldest region still being written, held by a reader, or fenced on a
//   capturing stream may never complete while its caller waits: that request overflows instead);
//   "error" raises RingFullError.
// - No lock is held across a call that can block (cudaHostAlloc, cudaFreeHost, cudaEventSynchronize):
//   one thread's first use or empty_cache() must not stall the others' staging. Freeing pinned
//   memory waits for the whole device, so only configure() and empty_cache() free any (see
//   pinned_memory.h); a staging call never does.
// - Rings are never destroyed (registry.h): at interpreter exit copies may still be in flight.
// - Every CUDA call a ring makes runs in relaxed capture mode (cuda_scope.h), so that a graph
//   captured meanwhile by another thread in torch's default "global" mode is neither refused nor
//   invalidated by it. The exception is freeing (empty_cache(), a resize): its device-wide wait is
//   invalid during any capture on the device, so it raises then and frees nothing.
// Each device has two rings: one for stagings (host to device) and one for fetches (device to
// host, whose regions are also held until the host is done reading them).
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

  // What try_acquire gives: a lease, or (on_full="wait" and no room) an event to wait for with
  // wait_for() before trying again. The event is always that of a copy already enqueued: a region
  // that may never complete while its caller waits (still being written, perhaps by the caller
  // itself re-entered from a conversion callback; held by a reader; its fence's stream capturing)
  // is not waited for, the request is served from an overflow block instead.
  struct Acquired {
    std::optional<HostLease> lease;
    cudaEvent_t wait_on = nullptr;
  };

  // Host memory for `bytes` (> 0) that no copy in flight uses. Never blocks on the device (pinning
  // new memory may take time, without the ring's lock held). Throws RingFullError when on_full is
  // kError and there is no room.
  Acquired try_acquire(size_t bytes);

  // Blocks until `event` (from try_acquire or fence_event) has completed; no lock is held meanwhile.
  // `why` opens the error raised under torch's sync debug mode "error" (the warning under "warn").
  void wait_for(cudaEvent_t event, const char* why);

  // The copy that uses `lease` is enqueued on `stream`; its fence is recorded behind it. A `held`
  // lease is also kept until unhold(); its fence is recorded at once and stays valid until then.
  // The region is sealed before anything that can fail: even when this throws (recording the
  // fence failed; a held lease is then unheld), it is released once its copy completes.
  StreamFence* commit(HostLease& lease, cudaStream_t stream, bool held = false);
  void abandon(HostLease& lease);
  // Cannot fail: a region whose holder could not let go would block every later one forever.
  void unhold(const HostLease& committed) noexcept;

  // For a held lease's fence: has its copy completed (no waiting), and the event to wait on.
  bool fence_done(StreamFence* fence);
  cudaEvent_t fence_event(StreamFence* fence);

  void set_options(std::optional<size_t> capacity, std::optional<OnFull> on_full);
  OnFull on_full() const { return on_full_.load(std::memory_order_relaxed); }

  // Frees retired slabs and spare overflow blocks whose copies have completed. May synchronise the
  // device (cudaFreeHost, called without the ring's lock held): for configure() and empty_cache().
  void free_unused();

  StagingCounters& counters() { return counters_; }

  struct Snapshot {
    size_t ring_bytes, in_flight_bytes, peak_in_flight_bytes, pending_regions;
    bool allocated;
    uint64_t overflows, waits, wraps, events_created, event_records, event_queries;
    size_t overflow_reserved_bytes, overflow_peak_reserved_bytes, overflow_in_flight_bytes;
  };
  Snapshot snapshot();

 private:
  void release_completed_locked();
  void allocate_slab();
  void unhold_locked(const HostLease& committed) noexcept;
  HostLease overflow_lease(std::unique_lock<std::mutex>& lock, size_t bytes);

  const c10::DeviceIndex device_;
  // Lock order: alloc_mu_, then mu_. mu_ guards the state and is never held across a call that can
  // block (cudaHostAlloc, cudaFreeHost, cudaEventSynchronize), so that one thread's empty_cache()
  // or first use does not stall every other thread's staging (PyTorch's CachingHostAllocator
  // keeps its lock off these calls for the same reason). alloc_mu_ serialises pinning the slab and
  // replacing it (set_options), so the slab being pinned is not replaced (and destroyed) meanwhile.
  std::mutex alloc_mu_;
  std::mutex mu_;
  std::unique_ptr<Slab> slab_;  // the live slab; base allocated lazily
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
