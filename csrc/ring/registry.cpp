#include "ring/registry.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <Python.h>
#include <c10/cuda/CUDAFunctions.h>

#include <optional>

#include "python/py_objects.h"
#endif

namespace pinstage {
namespace {

struct Registry {
  std::mutex mu;
  bool defaults_read = false;
  size_t ring_bytes = kDefaultRingBytes;
  OnFull on_full = OnFull::kOverflow;
#ifdef PINSTAGE_WITH_CUDA
  // [device][direction]
  std::vector<std::atomic<StagingRing*>> rings;
  Registry() : rings(2 * static_cast<size_t>(c10::cuda::device_count())) {
    for (auto& r : rings) r.store(nullptr);
  }
#endif
  void read_defaults_locked() {
    if (defaults_read) return;
    ring_bytes = ring_bytes_from_env();
    defaults_read = true;
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed (see registry.h)
  return *r;
}

#ifdef PINSTAGE_WITH_CUDA
// Calls fn on every ring that exists for `device` (every device when nullopt).
template <class Fn>
void for_each_ring(std::optional<c10::DeviceIndex> device, Fn&& fn) {
  Registry& r = registry();
  for (size_t i = 0; i < r.rings.size(); ++i) {
    if (device && i / 2 != static_cast<size_t>(*device)) continue;
    if (StagingRing* ring = r.rings[i].load(std::memory_order_acquire)) fn(*ring);
  }
}
#endif

}  // namespace

StagingCounters& cpu_counters() {
  static StagingCounters* c = new StagingCounters();
  return *c;
}

OnFull default_on_full() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.on_full;
}

#ifdef PINSTAGE_WITH_CUDA
StagingRing& ring_for(c10::DeviceIndex device, Direction direction) {
  Registry& r = registry();
  // The caller resolved `device` against the visible devices (see copy/target.h).
  auto& slot = r.rings[2 * static_cast<size_t>(device) + (direction == Direction::kToHost ? 1 : 0)];
  if (StagingRing* ring = slot.load(std::memory_order_acquire)) return *ring;
  std::lock_guard<std::mutex> lock(r.mu);
  r.read_defaults_locked();
  if (slot.load() == nullptr) slot.store(new StagingRing(device, r.ring_bytes, r.on_full), std::memory_order_release);
  return *slot.load();
}
#endif

void configure_rings(std::optional<size_t> ring_bytes, std::optional<OnFull> on_full,
                     std::optional<c10::DeviceIndex> device) {
  if (ring_bytes) check_ring_bytes(*ring_bytes, "ring_bytes");
  if (!device) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.read_defaults_locked();
    if (ring_bytes) r.ring_bytes = *ring_bytes;
    if (on_full) r.on_full = *on_full;
  }
#ifdef PINSTAGE_WITH_CUDA
  if (device) {  // make the device's rings now, so that the settings stick to them
    ring_for(*device, Direction::kToDevice);
    ring_for(*device, Direction::kToHost);
  }
  {
    GilReleasedIfHeld no_gil;  // a resize frees the old slab, which waits for the device
    for_each_ring(device, [&](StagingRing& ring) { ring.set_options(ring_bytes, on_full); });
  }
#else
  TORCH_CHECK(!device, "pinstage: built without CUDA; there is no ring for cuda:", static_cast<int>(*device));
#endif
}

void free_unused_ring_memory(std::optional<c10::DeviceIndex> device) {
#ifdef PINSTAGE_WITH_CUDA
  // cudaFreeHost may wait for the device: other Python threads keep staging meanwhile.
  GilReleasedIfHeld no_gil;
  for_each_ring(device, [](StagingRing& ring) { ring.free_unused(); });
#else
  (void)device;
#endif
}

}  // namespace pinstage
