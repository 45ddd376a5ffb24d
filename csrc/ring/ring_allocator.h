// RingAllocator: first-in-first-out byte ranges over a fixed buffer, each held until a completion
// fence says nothing reads it any more. See Note [Ring design] in ring/staging_ring.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>

#include "ring/options.h"

namespace pinstage {

template <class Fence>
class RingAllocator {
 public:
  struct Reservation {
    size_t offset;    // first byte of the caller's data, aligned as asked
    uint64_t ticket;  // names the region in seal() / abandon()
  };

  explicit RingAllocator(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t in_flight_bytes() const { return held_bytes_; }
  size_t peak_in_flight_bytes() const { return peak_held_bytes_; }
  // Times the head went back to the front of the ring: about the bytes passed through it / capacity.
  uint64_t wraps() const { return wraps_; }
  size_t pending_regions() const { return regions_.size(); }

  // Returns a region of `bytes` (> 0) at an offset that is a multiple of `alignment` (a power of
  // two), or nullopt when the free room cannot hold it right now.
  std::optional<Reservation> try_reserve(size_t bytes, size_t alignment) {
    if (bytes == 0 || bytes > capacity_) return std::nullopt;
    const size_t tail = regions_.empty() ? 0 : regions_.front().begin;
    const bool full = !regions_.empty() && head_ == tail;
    if (full) return std::nullopt;
    size_t offset;
    bool wrapped = false;    // the region starts at the front, past an unused end
    bool restarted = false;  // nothing was held: the head moved to the front first
    const size_t aligned = align_up(head_, alignment);
    const bool fits_at_head = aligned <= capacity_ && bytes <= capacity_ - aligned;
    if (regions_.empty() && !fits_at_head) {
      head_ = 0;  // nothing held: restart at the front, where anything up to the capacity fits
      offset = 0;
      restarted = true;
    } else if (regions_.empty() || head_ > tail) {
      // Free room is [head, capacity) then [0, tail).
      if (fits_at_head) {
        offset = aligned;
      } else if (bytes <= tail) {
        offset = 0;  // the unused end of the ring is held by this region until it is released
        wrapped = true;
      } else {
        return std::nullopt;
      }
    } else {
      // head < tail: free room is [head, tail).
      if (aligned > tail || bytes > tail - aligned) return std::nullopt;
      offset = aligned;
    }
    const size_t end = offset + bytes;
    const size_t held = wrapped ? (capacity_ - head_) + end : end - head_;
    regions_.push_back(Region{head_, held, State::kWriting, false, Fence{}});
    // A wrap is a return of the head to the front: a restart, past the unused end, or ending
    // exactly there; one per reservation (a restart for the whole capacity is one).
    if (restarted || wrapped || end == capacity_) ++wraps_;
    head_ = end == capacity_ ? 0 : end;
    held_bytes_ += held;
    if (held_bytes_ > peak_held_bytes_) peak_held_bytes_ = held_bytes_;
    return Reservation{offset, next_ticket_++};
  }

  // The copy that reads (or fills) the region is enqueued and `fence` completes after it. A region
  // sealed as `held` also stays until unhold(ticket): someone reads it on the host.
  void seal(uint64_t ticket, Fence fence, bool held = false) {
    Region& r = region(ticket);
    r.fence = fence;
    r.state = State::kSealed;
    r.holder = held;
  }

  // The holder of a region sealed as held is done with it.
  void unhold(uint64_t ticket) { region(ticket).holder = false; }

  // Nothing will read the region (its writer failed before enqueueing a copy).
  void abandon(uint64_t ticket) { region(ticket).state = State::kAbandoned; }

  // Releases, oldest first, every region that is abandoned or whose fence is done, stopping at the
  // first that is still being written or still in flight. `recycle` gets each released fence.
  // Returns the number of regions released.
  template <class IsDone, class Recycle>
  size_t release_completed(IsDone&& is_done, Recycle&& recycle) {
    size_t released = 0;
    while (!regions_.empty()) {
      Region& r = regions_.front();
      if (r.state == State::kWriting || r.holder) break;
      if (r.state == State::kSealed) {
        if (!is_done(r.fence)) break;
        recycle(r.fence);
      }
      held_bytes_ -= r.held;
      regions_.pop_front();
      ++first_ticket_;
      ++released;
    }
    return released;
  }

  // The fence whose completion would release the oldest region, the one a full ring can wait for;
  // nullptr when there is none: no region, or the oldest is still being written or is held by a
  // reader. Such a region may never complete while the caller waits (its writer may be the caller,
  // re-entered from a conversion callback, or a thread waiting for the caller), so a full ring
  // serves those requests elsewhere instead of waiting.
  const Fence* waitable_oldest_fence() const {
    if (regions_.empty()) return nullptr;
    const Region& r = regions_.front();
    if (r.state != State::kSealed || r.holder) return nullptr;
    return &r.fence;
  }

 private:
  enum class State : uint8_t { kWriting, kSealed, kAbandoned };
  struct Region {
    size_t begin;  // first held byte: where head stood when reserved (padding belongs to the region)
    size_t held;   // bytes from begin to the end of the data, across the wrap if there was one
    State state;
    bool holder;  // a holder still reads it (see seal)
    Fence fence;
  };

  Region& region(uint64_t ticket) {
    if (ticket < first_ticket_ || ticket - first_ticket_ >= regions_.size()) {
      throw std::logic_error("RingAllocator: unknown or already released ticket");
    }
    return regions_[ticket - first_ticket_];
  }

  size_t capacity_;
  size_t head_ = 0;  // next free byte
  std::deque<Region> regions_;
  uint64_t first_ticket_ = 0;  // ticket of regions_.front()
  uint64_t next_ticket_ = 0;
  size_t held_bytes_ = 0;
  size_t peak_held_bytes_ = 0;
  uint64_t wraps_ = 0;
};

}  // namespace pinstage
