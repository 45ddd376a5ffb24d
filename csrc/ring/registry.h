// The process-wide rings: for each CUDA device, one for stagings (host to device) and one for
// fetches (device to host), made on first use, and the settings they are made with. Rings are
// never destroyed: at interpreter exit copies may still be in flight, and freeing pinned memory
// under them (or calling into a CUDA runtime that is shutting down) is what would crash or hang;
// the driver reclaims everything when the process ends.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "ring/counters.h"
#include "ring/options.h"
#ifdef PINSTAGE_WITH_CUDA
#include "ring/staging_ring.h"
#endif

namespace pinstage {

enum class Direction { kToDevice, kToHost };

// Counters of results made on the CPU (no ring involved).
StagingCounters& cpu_counters();

// Settings for rings made from now on and for the existing rings of `device`, or of every device
// when device is nullopt. ValueError for a ring size that is not positive.
void configure_rings(std::optional<size_t> ring_bytes, std::optional<OnFull> on_full,
                     std::optional<c10::DeviceIndex> device);

// Frees what the rings keep but no copy uses: spare overflow blocks, slabs retired by configure().
// May synchronise the device.
void free_unused_ring_memory(std::optional<c10::DeviceIndex> device);

OnFull default_on_full();

#ifdef PINSTAGE_WITH_CUDA
StagingRing& ring_for(c10::DeviceIndex device, Direction direction);
#endif

}  // namespace pinstage
