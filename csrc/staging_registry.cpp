#include "staging_registry.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

#ifdef PINSTAGE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace pinstage {
namespace {

struct Registry {
  std::mutex mu;
  bool defaults_read = false;
  size_t ring_bytes = kDefaultRingBytes;
  OnFull on_full = OnFull::kOverflow;
#ifdef PINSTAGE_WITH_CUDA
  std::vector<std::atomic<StagingRing*>> rings;
  Registry() : rings(static_cast<size_t>(c10::cuda::device_count())) {
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
  static Registry* r = new Registry();  // never destroyed (see header)
  return *r;
}

}  // namespace

CpuCounters& cpu_counters() {
  static CpuCounters* c = new CpuCounters();
  return *c;
}

size_t default_ring_bytes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.read_defaults_locked();
  return r.ring_bytes;
}

OnFull default_on_full() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.on_full;
}

#ifdef PINSTAGE_WITH_CUDA
StagingRing* existing_ring(c10::DeviceIndex device) {
  Registry& r = registry();
  TORCH_CHECK_VALUE(device >= 0 && static_cast<size_t>(device) < r.rings.size(), "pinstage: no CUDA device ",
                    static_cast<int>(device));
  return r.rings[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

StagingRing& ring_for(c10::DeviceIndex device) {
  if (StagingRing* ring = existing_ring(device)) return *ring;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.read_defaults_locked();
  auto& slot = r.rings[static_cast<size_t>(device)];
  if (slot.load() == nullptr) slot.store(new StagingRing(device, r.ring_bytes, r.on_full), std::memory_order_release);
  return *slot.load();
}
#endif

void configure_rings(std::optional<size_t> ring_bytes, std::optional<OnFull> on_full, std::optional<int> device) {
  TORCH_CHECK_VALUE(!ring_bytes || *ring_bytes > 0, "pinstage: ring_bytes must be positive");
  Registry& r = registry();
  if (!device) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.read_defaults_locked();
      if (ring_bytes) r.ring_bytes = *ring_bytes;
      if (on_full) r.on_full = *on_full;
    }
#ifdef PINSTAGE_WITH_CUDA
    for (size_t d = 0; d < r.rings.size(); ++d) {
      if (StagingRing* ring = r.rings[d].load()) ring->set_options(ring_bytes, on_full);
    }
#endif
    return;
  }
#ifdef PINSTAGE_WITH_CUDA
  ring_for(static_cast<c10::DeviceIndex>(*device)).set_options(ring_bytes, on_full);
#else
  TORCH_CHECK(false, "pinstage: built without CUDA; there is no ring for device ", *device);
#endif
}

}  // namespace pinstage
