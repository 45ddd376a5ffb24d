#include "staging_options.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cstdlib>

namespace pinstage {

OnFull parse_on_full(const std::string& s) {
  if (s == "overflow") return OnFull::kOverflow;
  if (s == "wait") return OnFull::kWait;
  if (s == "error") return OnFull::kError;
  TORCH_CHECK_VALUE(false, "pinstage: on_full must be \"overflow\", \"wait\" or \"error\", got \"", s, "\"");
}

const char* on_full_name(OnFull f) {
  switch (f) {
    case OnFull::kOverflow: return "overflow";
    case OnFull::kWait: return "wait";
    default: return "error";
  }
}

size_t ring_bytes_from_env() {
  const char* env = std::getenv("PINSTAGE_RING_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultRingBytes;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(env, &end, 10);
  size_t scale = 1;
  if (end != nullptr && *end != '\0') {
    switch (std::toupper(static_cast<unsigned char>(*end))) {
      case 'K': scale = size_t{1} << 10; break;
      case 'M': scale = size_t{1} << 20; break;
      case 'G': scale = size_t{1} << 30; break;
      default: scale = 0;
    }
    if (scale != 0 && end[1] != '\0' && !(std::toupper(static_cast<unsigned char>(end[1])) == 'B' && end[2] == '\0') &&
        !(std::toupper(static_cast<unsigned char>(end[1])) == 'I' && std::toupper(static_cast<unsigned char>(end[2])) == 'B' && end[3] == '\0')) {
      scale = 0;
    }
  }
  TORCH_CHECK_VALUE(end != env && scale != 0 && n > 0,
                    "pinstage: PINSTAGE_RING_BYTES must be a positive byte count such as 8388608 or 8M, got \"", env, "\"");
  return static_cast<size_t>(n) * scale;
}

}  // namespace pinstage
