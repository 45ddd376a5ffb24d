// What staging does when the ring has no free room, and how big a ring is by default.
#pragma once

#include <cstddef>
#include <string>

namespace pinstage {

enum class OnFull {
  kOverflow,  // serve from an overflow pinned block (never waits): the default
  kWait,      // wait for the oldest in-flight copy to complete
  kError,     // raise RuntimeError
};

constexpr size_t kDefaultRingBytes = size_t{8} << 20;

// Ring regions and the items of one stage_many start at this alignment: enough for any element
// type and for 16-byte vector loads of the staged data on the device.
constexpr size_t kStagingAlignment = 16;

OnFull parse_on_full(const std::string& s);  // throws ValueError-mapped c10::ValueError
const char* on_full_name(OnFull f);

// PINSTAGE_RING_BYTES (bytes, or with a K/M/G suffix), else kDefaultRingBytes.
size_t ring_bytes_from_env();

}  // namespace pinstage
