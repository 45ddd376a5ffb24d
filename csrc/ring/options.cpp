#include "ring/options.h"

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
    case OnFull::kOverflow:
      return "overflow";
    case OnFull::kWait:
      return "wait";
    default:
      return "error";
  }
}

size_t parse_byte_count(const std::string& text, const char* what) {
  size_t i = 0;
  unsigned long long n = 0;
  bool overflow = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    overflow |= __builtin_mul_overflow(n, 10ULL, &n) || __builtin_add_overflow(n, text[i] - '0', &n);
  }
  const bool has_digits = i > 0;
  unsigned shift = 0;
  std::string unit;
  for (; i < text.size(); ++i) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  if (!unit.empty()) {
    shift = unit[0] == 'K' ? 10 : unit[0] == 'M' ? 20 : unit[0] == 'G' ? 30 : 64;
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") shift = 64;
  }
  TORCH_CHECK_VALUE(has_digits && shift < 64 && n > 0, "pinstage: ", what,
                    " must be a positive byte count such as 8388608, \"8M\" or \"1G\", got \"", text, "\"");
  TORCH_CHECK_VALUE(!overflow && n <= (static_cast<unsigned long long>(INT64_MAX) >> shift), "pinstage: ", what, " \"",
                    text, "\" is too large");
  return static_cast<size_t>(n << shift);
}

void check_ring_bytes(size_t bytes, const char* what) {
  TORCH_CHECK_VALUE(bytes >= kMinRingBytes, "pinstage: ", what, " must be at least ", kMinRingBytes,
                    " bytes (one page), got ", bytes);
}

size_t ring_bytes_from_env() {
  const char* env = std::getenv("PINSTAGE_RING_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultRingBytes;
  const size_t bytes = parse_byte_count(env, "PINSTAGE_RING_BYTES");
  check_ring_bytes(bytes, "PINSTAGE_RING_BYTES");
  return bytes;
}

}  // namespace pinstage
