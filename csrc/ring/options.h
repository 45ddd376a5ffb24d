// How a ring is set up: what staging does when it has no free room, its default size, alignment.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <string>

namespace pinstage {

// The ring has no room and on_full="error": pinstage.RingFullError (a RuntimeError) in Python.
struct RingFullError : c10::Error {
  using c10::Error::Error;
};

enum class OnFull {
  kOverflow,  // serve from an overflow pinned block (never waits): the default
  kWait,      // wait for the oldest in-flight copy to complete
  kError,     // raise RingFullError (pinstage.RingFullError, a RuntimeError, in Python)
};

constexpr size_t kDefaultRingBytes = size_t{8} << 20;
// The smallest ring: one page (pinned memory is allocated in pages; a smaller ring would only send
// more copies to overflow blocks). configure() and PINSTAGE_RING_BYTES refuse less (ValueError).
constexpr size_t kMinRingBytes = 4096;

// Ring regions and the items of one stage_many start at this alignment: enough for any element
// type and for 16-byte vector loads of the staged data on the device.
constexpr size_t kStagingAlignment = 16;

// x rounded up to a multiple of a (a power of two).
constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

OnFull parse_on_full(const std::string& s);  // ValueError for anything else
const char* on_full_name(OnFull f);

// A byte count: digits with an optional K, M or G suffix (and an optional trailing B or iB), > 0;
// ValueError naming `what` otherwise. The one parser for PINSTAGE_RING_BYTES and configure().
size_t parse_byte_count(const std::string& text, const char* what);

// ValueError naming `what` and the value when bytes < kMinRingBytes.
void check_ring_bytes(size_t bytes, const char* what);

// PINSTAGE_RING_BYTES, else kDefaultRingBytes.
size_t ring_bytes_from_env();

}  // namespace pinstage
