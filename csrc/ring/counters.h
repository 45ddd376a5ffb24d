// What a ring (or, for results on the CPU, the process) counts about the stagings it served.
#pragma once

#include <atomic>
#include <cstdint>

namespace pinstage {

struct StagingCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> fallbacks{0};

  // One call that moved `bytes` with `copies` copies, `fallbacks` of its items through torch.tensor.
  void record(uint64_t n_bytes, uint64_t n_copies, uint64_t n_fallbacks) {
    calls.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(n_bytes, std::memory_order_relaxed);
    if (n_copies) copies.fetch_add(n_copies, std::memory_order_relaxed);
    if (n_fallbacks) fallbacks.fetch_add(n_fallbacks, std::memory_order_relaxed);
  }
};

}  // namespace pinstage
