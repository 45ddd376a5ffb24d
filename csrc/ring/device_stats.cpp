#include "ring/device_stats.h"

#include "ring/registry.h"

namespace pinstage {

DeviceStats device_stats(c10::Device device) {
  DeviceStats out;
  out.device = device;
  out.on_full = default_on_full();
  if (device.is_cpu()) {
    const StagingCounters& c = cpu_counters();
    out.calls = c.calls, out.bytes_staged = c.bytes, out.fallbacks = c.fallbacks;
    return out;
  }
#ifdef PINSTAGE_WITH_CUDA
  StagingRing& ring = ring_for(device.index(), Direction::kToDevice);
  StagingRing& fetch_ring = ring_for(device.index(), Direction::kToHost);
  const StagingRing::Snapshot s = ring.snapshot();
  const StagingRing::Snapshot f = fetch_ring.snapshot();
  const StagingCounters& c = ring.counters();
  const StagingCounters& fc = fetch_ring.counters();
  out.on_full = ring.on_full();
  out.ring_allocated = s.allocated;
  out.ring_bytes = s.ring_bytes;
  out.calls = c.calls, out.bytes_staged = c.bytes, out.copies = c.copies, out.fallbacks = c.fallbacks;
  out.in_flight_bytes = s.in_flight_bytes, out.peak_in_flight_bytes = s.peak_in_flight_bytes;
  out.pending_regions = s.pending_regions;
  out.overflows = s.overflows, out.waits = s.waits, out.wraps = s.wraps;
  out.events_created = s.events_created + f.events_created;
  out.event_records = s.event_records + f.event_records;
  out.event_queries = s.event_queries + f.event_queries;
  out.overflow_reserved_bytes = s.overflow_reserved_bytes + f.overflow_reserved_bytes;
  out.overflow_peak_reserved_bytes = s.overflow_peak_reserved_bytes + f.overflow_peak_reserved_bytes;
  out.overflow_in_flight_bytes = s.overflow_in_flight_bytes;
  out.fetches = fc.calls, out.fetch_bytes = fc.bytes;
  out.fetch_in_flight_bytes = f.in_flight_bytes + f.overflow_in_flight_bytes;
  out.fetch_overflows = f.overflows;
#endif
  return out;
}

}  // namespace pinstage
