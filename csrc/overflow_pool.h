// OverflowPool: pinned blocks that serve requests the ring cannot hold right now (its room is still
// in flight, or the request is larger than the ring). The same rule as the ring: a block goes back
// to the free list only after the event recorded behind the copy that read it has completed.
// Blocks are kept (power-of-two sizes) for reuse; they are freed only with the process.
// Blocks are fenced like ring regions (StreamFence), so one event covers many of them.
// Not thread-safe: the owning StagingRing serialises access.
#pragma once
#ifdef PINSTAGE_WITH_CUDA

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "stream_fence.h"

namespace pinstage {

// `bytes` of portable pinned host memory (the copy engine of any device may read it, whichever
// device is current later). torch.OutOfMemoryError when the host cannot pin that much; the failed
// call's error is cleared so that it does not surface in an unrelated later CUDA check.
inline uint8_t* allocate_pinned(size_t bytes, c10::DeviceIndex device) {
  c10::cuda::CUDAGuard guard(device);
  // Relaxed capture mode: a graph captured meanwhile by another thread in "global" mode neither
  // refuses nor is invalidated by this call (PyTorch's caching allocators do the same).
  c10::cuda::CUDAStreamCaptureModeGuard capture_mode(cudaStreamCaptureModeRelaxed);
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "pinstage: could not pin ", bytes, " bytes of host memory for cuda:",
                     static_cast<int>(device), ": ", cudaGetErrorString(err));
  }
  return static_cast<uint8_t*>(p);
}

class OverflowPool {
 public:
  struct Block {
    uint8_t* data = nullptr;
    size_t bytes = 0;
  };

  explicit OverflowPool(c10::DeviceIndex device) : device_(device) {}
  OverflowPool(const OverflowPool&) = delete;
  OverflowPool& operator=(const OverflowPool&) = delete;

  // A block of at least `bytes`; from the free list when one fits, else freshly pinned.
  Block take(size_t bytes, StreamFences& fences) {
    release_completed(fences);
    const size_t size = round_size(bytes);
    auto it = free_.lower_bound(size);
    if (it != free_.end()) {
      Block b = it->second;
      free_.erase(it);
      return b;
    }
    uint8_t* p = allocate_pinned(size, device_);
    reserved_bytes_ += size;
    return Block{p, size};
  }

  void seal(const Block& b, StreamFence* done) { in_flight_.emplace_back(b, done); }

  void give_back(const Block& b) { free_.emplace(b.bytes, b); }

  void release_completed(StreamFences& fences) {
    for (size_t i = 0; i < in_flight_.size();) {
      if (fences.done(in_flight_[i].second)) {
        fences.release(in_flight_[i].second);
        give_back(in_flight_[i].first);
        in_flight_[i] = in_flight_.back();
        in_flight_.pop_back();
      } else {
        ++i;
      }
    }
  }

  size_t reserved_bytes() const { return reserved_bytes_; }
  size_t in_flight_bytes() const {
    size_t n = 0;
    for (const auto& f : in_flight_) n += f.first.bytes;
    return n;
  }

 private:
  static size_t round_size(size_t bytes) {
    // Beyond 2**62 no power of two is left to round to; ask for exactly that much (and fail).
    if (bytes > (size_t{1} << 62)) return bytes;
    size_t s = size_t{1} << 16;  // 64 KiB floor: fewer, reusable blocks
    while (s < bytes) s <<= 1;
    return s;
  }

  c10::DeviceIndex device_;
  std::multimap<size_t, Block> free_;
  std::vector<std::pair<Block, StreamFence*>> in_flight_;
  size_t reserved_bytes_ = 0;
};

}  // namespace pinstage

#endif  // PINSTAGE_WITH_CUDA
