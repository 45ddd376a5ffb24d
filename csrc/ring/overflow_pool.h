// OverflowPool: pinned blocks for the requests the ring cannot hold right now, reused under the
// ring's fence rule (see Note [Ring design] in ring/staging_ring.h); freed only through
// take_spare(), by configure() and empty_cache(). It makes no CUDA call but fence queries; the
// owning StagingRing serialises access.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "ring/stream_fence.h"

namespace pinstage {

class OverflowPool {
 public:
  struct Block {
    uint8_t* data = nullptr;
    size_t bytes = 0;
  };

  OverflowPool() = default;
  OverflowPool(const OverflowPool&) = delete;
  OverflowPool& operator=(const OverflowPool&) = delete;

  // A free block of at least `bytes`, or nullopt: the caller then pins a block of
  // block_size(bytes) without the ring's lock held and hands it to adopt().
  std::optional<Block> take_free(size_t bytes, StreamFences& fences) {
    release_completed(fences);
    auto it = free_.lower_bound(block_size(bytes));
    if (it == free_.end()) return std::nullopt;
    Block b = it->second;
    free_.erase(it);
    free_bytes_ -= b.bytes;
    return b;
  }

  // A block freshly pinned for a caller of take_free: counted as reserved from now on.
  void adopt(const Block& b) {
    reserved_bytes_ += b.bytes;
    peak_reserved_bytes_ = std::max(peak_reserved_bytes_, reserved_bytes_);
  }

  static size_t block_size(size_t bytes) {
    // Beyond 2**62 no power of two is left to round to; ask for exactly that much (and fail).
    if (bytes > (size_t{1} << 62)) return bytes;
    size_t s = size_t{1} << 16;  // 64 KiB floor: fewer, reusable blocks
    while (s < bytes) s <<= 1;
    return s;
  }

  void seal(const Block& b, StreamFence* done, bool held) { in_flight_.push_back(InFlight{b, done, held}); }

  // The holder of a block sealed as held is done with it.
  void unhold(const uint8_t* data) {
    for (InFlight& f : in_flight_) {
      if (f.block.data == data) f.held = false;
    }
  }

  void give_back(const Block& b) {
    free_.emplace(b.bytes, b);
    free_bytes_ += b.bytes;
  }

  void release_completed(StreamFences& fences) {
    for (size_t i = 0; i < in_flight_.size();) {
      InFlight& f = in_flight_[i];
      if (!f.held && fences.done(f.fence)) {
        fences.release(f.fence);
        give_back(f.block);
        in_flight_[i] = in_flight_.back();
        in_flight_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // Takes free blocks out of the pool until at most `keep` bytes of them are left (largest first);
  // the caller frees them without the ring's lock held (cudaFreeHost may wait for the device).
  std::vector<Block> take_spare(size_t keep) {
    std::vector<Block> spare;
    while (free_bytes_ > keep && !free_.empty()) {
      auto last = std::prev(free_.end());
      spare.push_back(last->second);
      free_bytes_ -= last->second.bytes;
      reserved_bytes_ -= last->second.bytes;
      free_.erase(last);
    }
    return spare;
  }

  size_t reserved_bytes() const { return reserved_bytes_; }
  size_t peak_reserved_bytes() const { return peak_reserved_bytes_; }
  size_t in_flight_bytes() const {
    size_t n = 0;
    for (const auto& f : in_flight_) n += f.block.bytes;
    return n;
  }

 private:
  struct InFlight {
    Block block;
    StreamFence* fence;
    bool held;
  };

  std::multimap<size_t, Block> free_;
  size_t free_bytes_ = 0;
  std::vector<InFlight> in_flight_;
  size_t reserved_bytes_ = 0;
  size_t peak_reserved_bytes_ = 0;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
