#ifdef PINSTAGE_WITH_CUDA
#include "ring/staging_ring.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "ring/cuda_scope.h"
#include "ring/pinned_memory.h"

namespace pinstage {
namespace {

// Reclaiming asks the oldest fences whether they are done; doing it only every so many regions (or
// when room runs out) keeps the per-call cost at a fraction of one cudaEventQuery.
constexpr size_t kReclaimEvery = 32;

// An open fence covers at most this share of the ring (see stream_fence.h).
constexpr size_t kFencesPerRing = 64;

}  // namespace

StagingRing::StagingRing(c10::DeviceIndex device, size_t capacity, OnFull on_full)
    : device_(device),
      slab_(std::make_unique<Slab>(capacity)),
      capacity_(capacity),
      on_full_(on_full),
      events_(device),
      reclaim_at_(kReclaimEvery) {
  fences_.set_bytes_per_fence(capacity / kFencesPerRing);
}

void StagingRing::release_completed_locked() {
  const RingCudaScope scope(device_);
  auto is_done = [this](StreamFence* f) { return fences_.done(f); };
  auto recycle = [this](StreamFence* f) { fences_.release(f); };
  slab_->ring.release_completed(is_done, recycle);
  reclaim_at_ = slab_->ring.pending_regions() + kReclaimEvery;
  for (auto& retired : retired_) retired->ring.release_completed(is_done, recycle);
}

void StagingRing::free_unused() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (retired_.empty() && overflow_.reserved_bytes() == 0) return;  // nothing that could be freed
  }
  drain_device(device_);  // before anything is taken: if it fails, every block stays where it was
  std::vector<uint8_t*> unused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    release_completed_locked();
    const RingCudaScope scope(device_);
    overflow_.release_completed(fences_);
    for (const OverflowPool::Block& b : overflow_.take_spare(0)) unused.push_back(b.data);
    for (size_t i = 0; i < retired_.size();) {
      if (retired_[i]->ring.pending_regions() == 0) {
        unused.push_back(retired_[i]->base);
        retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  free_pinned(unused, device_);
}

void StagingRing::allocate_slab() {
  std::lock_guard<std::mutex> alloc(alloc_mu_);
  size_t capacity;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slab_->base != nullptr) return;  // another thread pinned it meanwhile
    capacity = capacity_;
  }
  uint8_t* base = allocate_pinned(capacity, device_);
  std::lock_guard<std::mutex> lock(mu_);
  slab_->base = base;
}

HostLease StagingRing::overflow_lease(std::unique_lock<std::mutex>& lock, size_t bytes) {
  const RingCudaScope scope(device_);
  HostLease lease;
  if (auto block = overflow_.take_free(bytes, fences_)) {
    lease.block = *block;
  } else {
    lock.unlock();
    const size_t size = OverflowPool::block_size(bytes);
    lease.block = OverflowPool::Block{allocate_pinned(size, device_), size};
    lock.lock();
    overflow_.adopt(lease.block);
  }
  lease.data = lease.block.data;
  lease.bytes = bytes;
  ++overflows_;
  return lease;
}

StagingRing::Acquired StagingRing::try_acquire(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  while (slab_->base == nullptr) {
    lock.unlock();
    allocate_slab();
    lock.lock();  // the slab may have been replaced meanwhile (configure): check again
  }
  Slab& slab = *slab_;
  if (slab.ring.pending_regions() >= reclaim_at_) release_completed_locked();
  auto r = slab.ring.try_reserve(bytes, kStagingAlignment);
  if (!r) {
    release_completed_locked();
    r = slab.ring.try_reserve(bytes, kStagingAlignment);
  }
  if (r) {
    HostLease lease;
    lease.data = slab.base + r->offset;
    lease.bytes = bytes;
    lease.slab = &slab;
    lease.ticket = r->ticket;
    return Acquired{lease};
  }
  const OnFull mode = on_full();
  if (mode == OnFull::kError) {
    throw RingFullError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        c10::str("pinstage: the ring of cuda:", static_cast<int>(device_), " has no room for ", bytes,
                                 " bytes (", slab.ring.in_flight_bytes(), " of ", capacity_,
                                 " bytes are in use by copies in flight) and on_full=\"error\"; raise ring_bytes "
                                 "with pinstage.configure(ring_bytes=...) or use on_full=\"overflow\""));
  }
  // Waiting helps only when the request can ever fit and the oldest region waits for nothing but
  // its copy; otherwise (and for on_full="overflow") an overflow block serves it.
  if (mode == OnFull::kWait && bytes <= capacity_) {
    if (StreamFence* const* oldest = slab.ring.waitable_oldest_fence()) {
      const RingCudaScope scope(device_);
      if (cudaEvent_t event = fences_.event_to_wait_on(*oldest)) {
        ++waits_;
        return Acquired{std::nullopt, event};
      }
    }
  }
  return Acquired{overflow_lease(lock, bytes)};
}

void StagingRing::wait_for(cudaEvent_t event, const char* why) {
  // This is the one blocking call in pinstage; honour torch's sync debug mode like torch's own.
  const auto mode = c10::cuda::warning_state().get_sync_debug_mode();
  TORCH_CHECK(mode != c10::cuda::SyncDebugMode::L_ERROR, why,
              ", and synchronisation is an error here "
              "(torch.cuda.set_sync_debug_mode / pinstage.testing.no_sync)");
  if (mode == c10::cuda::SyncDebugMode::L_WARN) TORCH_WARN(why, " (torch.cuda.set_sync_debug_mode)");
  // The event may be recycled by another thread once released, but only after it completed, and
  // a recorded-then-completed event stays completed until it is recorded again behind new work;
  // waiting on it then still terminates. No lock is held while waiting.
  const RingCudaScope scope(device_);
  C10_CUDA_CHECK(cudaEventSynchronize(event));
}

StreamFence* StagingRing::commit(HostLease& lease, cudaStream_t stream, bool held) {
  std::lock_guard<std::mutex> lock(mu_);
  // Overflow blocks and held regions get a fence recorded right away: overflow blocks exist
  // because room is short, and a held region's holder asks about its own copy.
  const bool record_now = lease.slab == nullptr || held;
  StreamFence* f = fences_.attach(stream, record_now ? SIZE_MAX : lease.bytes);
  if (lease.slab != nullptr) {
    lease.slab->ring.seal(lease.ticket, f, held);
  } else {
    overflow_.seal(lease.block, f, held);
  }
  const HostLease sealed = lease;
  if (!held) lease = HostLease{};
  if (fences_.due(f)) {
    try {
      const RingCudaScope scope(device_);
      fences_.record(f);
    } catch (...) {
      // Nobody will hold a lease whose commit failed; the open fence is recorded at the next check.
      if (held) unhold_locked(sealed);
      throw;
    }
  }
  return f;
}

void StagingRing::unhold_locked(const HostLease& committed) noexcept {
  if (committed.slab != nullptr) {
    committed.slab->ring.unhold(committed.ticket);
  } else {
    overflow_.unhold(committed.block.data);
  }
}

void StagingRing::unhold(const HostLease& committed) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  unhold_locked(committed);
}

bool StagingRing::fence_done(StreamFence* fence) {
  std::lock_guard<std::mutex> lock(mu_);
  const RingCudaScope scope(device_);
  return fences_.done(fence);
}

cudaEvent_t StagingRing::fence_event(StreamFence* fence) {
  std::lock_guard<std::mutex> lock(mu_);
  const RingCudaScope scope(device_);
  return fences_.event_to_wait_on(fence);
}

void StagingRing::abandon(HostLease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.slab != nullptr) {
    lease.slab->ring.abandon(lease.ticket);
  } else if (lease.block.data != nullptr) {
    overflow_.give_back(lease.block);
  }
  lease = HostLease{};
}

void StagingRing::set_options(std::optional<size_t> capacity, std::optional<OnFull> on_full) {
  if (on_full) on_full_.store(*on_full, std::memory_order_relaxed);
  if (!capacity) return;
  {
    std::lock_guard<std::mutex> alloc(alloc_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    if (*capacity == capacity_) return;
    // A pinned slab is retired, and freed by free_unused() below once nothing uses it; one never
    // pinned (configure() before the first staging) has no region and is simply replaced.
    if (slab_->base != nullptr) {
      wraps_retired_ += slab_->ring.wraps();
      peak_retired_ = std::max(peak_retired_, slab_->ring.peak_in_flight_bytes());
      retired_.push_back(std::move(slab_));
    }
    slab_ = std::make_unique<Slab>(*capacity);
    capacity_ = *capacity;
    fences_.set_bytes_per_fence(capacity_ / kFencesPerRing);
  }
  free_unused();
}

StagingRing::Snapshot StagingRing::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  release_completed_locked();
  {
    const RingCudaScope scope(device_);
    overflow_.release_completed(fences_);
  }
  const auto& ring = slab_->ring;
  size_t retired_in_flight = 0;
  for (const auto& s : retired_) retired_in_flight += s->ring.in_flight_bytes();
  Snapshot s{};
  s.ring_bytes = capacity_;
  s.allocated = slab_->base != nullptr;
  s.in_flight_bytes = ring.in_flight_bytes() + retired_in_flight;
  s.peak_in_flight_bytes = std::max(ring.peak_in_flight_bytes(), peak_retired_);
  s.pending_regions = ring.pending_regions();
  s.overflows = overflows_;
  s.waits = waits_;
  s.wraps = ring.wraps() + wraps_retired_;
  s.events_created = events_.created();
  s.event_records = fences_.records();
  s.event_queries = fences_.queries();
  s.overflow_reserved_bytes = overflow_.reserved_bytes();
  s.overflow_peak_reserved_bytes = overflow_.peak_reserved_bytes();
  s.overflow_in_flight_bytes = overflow_.in_flight_bytes();
  return s;
}

}  // namespace pinstage
#endif  // PINSTAGE_WITH_CUDA
