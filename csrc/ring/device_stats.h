// DeviceStats: what pinstage.stats() reports for one device, filled in one place (device_stats).
// A counter is added by one line of PINSTAGE_STAT_COUNTERS (and its key in pinstage/_api.py's Stats).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "ring/options.h"

namespace pinstage {

// X(name): every integer counter, in the order stats() lists them.
#define PINSTAGE_STAT_COUNTERS(X)                                                                  \
  X(ring_bytes)                   /* the staging ring's size */                                    \
  X(calls)                        /* staging calls */                                              \
  X(bytes_staged)                 /* bytes they moved */                                           \
  X(copies)                       /* host-to-device copies enqueued */                             \
  X(fallbacks)                    /* items converted by torch.tensor, not pinstage's converters */ \
  X(in_flight_bytes)              /* ring bytes still read by copies */                            \
  X(peak_in_flight_bytes)         /* the most ever */                                              \
  X(pending_regions)              /* ring regions not yet released */                              \
  X(overflows)                    /* requests served by overflow blocks */                         \
  X(waits)                        /* waits under on_full="wait" */                                 \
  X(wraps)                        /* times the ring's allocation went back to its start */         \
  X(events_created)               /* CUDA events made (none in steady state) */                    \
  X(event_records)                /* cudaEventRecord calls (one per 32 regions or fewer) */        \
  X(event_queries)                /* cudaEventQuery calls, ready or not (~1 per fence) */          \
  X(overflow_reserved_bytes)      /* pinned overflow blocks kept now */                            \
  X(overflow_peak_reserved_bytes) /* ... at most */                                                \
  X(overflow_in_flight_bytes)     /* ... in use by copies */                                       \
  X(fetches)                      /* fetch_to_host calls */                                        \
  X(fetch_bytes)                  /* bytes they brought back */                                    \
  X(fetch_in_flight_bytes)        /* fetch ring and overflow bytes not yet released */             \
  X(fetch_overflows)              /* fetches served by overflow blocks */

struct DeviceStats {
  c10::Device device{c10::kCPU};
  bool ring_allocated = false;
  OnFull on_full = OnFull::kOverflow;
#define PINSTAGE_STAT_FIELD(name) uint64_t name = 0;
  PINSTAGE_STAT_COUNTERS(PINSTAGE_STAT_FIELD)
#undef PINSTAGE_STAT_FIELD
};

// The same counters for the CPU (results made on the CPU: no ring, its keys 0) and a CUDA device.
DeviceStats device_stats(c10::Device device);

}  // namespace pinstage
