// The process-wide set of staging rings (one per CUDA device, made on first use) and the settings
// they are made with. Rings are never destroyed: at interpreter exit copies may still be in flight,
// and freeing pinned memory under them (or calling into a CUDA runtime that is shutting down) is
// what would crash or hang; the driver reclaims everything when the process ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "staging_options.h"
#ifdef PINSTAGE_WITH_CUDA
#include "staging_ring.h"
#endif

namespace pinstage {

// Counters for results made on the CPU (no ring involved).
struct CpuCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes_staged{0};
  std::atomic<uint64_t> fallbacks{0};
};
CpuCounters& cpu_counters();

// Settings for rings made from now on, and (device == nullopt) for every existing ring too.
void configure_rings(std::optional<size_t> ring_bytes, std::optional<OnFull> on_full,
                     std::optional<int> device);

size_t default_ring_bytes();
OnFull default_on_full();

#ifdef PINSTAGE_WITH_CUDA
StagingRing& ring_for(c10::DeviceIndex device);
// The ring of `device` if one was made, else nullptr.
StagingRing* existing_ring(c10::DeviceIndex device);
#endif

}  // namespace pinstage
