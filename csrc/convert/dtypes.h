// The element types pinstage stages, and the one place that maps a ScalarType to a C++ type.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <string>

namespace pinstage {

// bool, the integer types (unsigned up to 64 bits) and the four floating types torch.tensor makes
// from Python numbers; not complex, float8 or the bit-packed types.
inline bool is_supported_dtype(c10::ScalarType t) {
  using c10::ScalarType;
  return c10::isIntegralType(t, /*includeBool=*/true) || t == ScalarType::Half || t == ScalarType::BFloat16 ||
         t == ScalarType::Float || t == ScalarType::Double;
}

// The name Python users know a dtype by ("torch.int32", not c10's "Int"), for error messages.
inline std::string dtype_name(c10::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

// Calls fn(T{}) with T the C++ element type of `t`; `t` must be supported.
template <class Fn>
decltype(auto) dispatch_dtype(c10::ScalarType t, Fn&& fn) {
  switch (t) {
    case c10::ScalarType::Bool:
      return fn(bool{});
    case c10::ScalarType::Byte:
      return fn(uint8_t{});
    case c10::ScalarType::Char:
      return fn(int8_t{});
    case c10::ScalarType::Short:
      return fn(int16_t{});
    case c10::ScalarType::Int:
      return fn(int32_t{});
    case c10::ScalarType::Long:
      return fn(int64_t{});
    case c10::ScalarType::UInt16:
      return fn(uint16_t{});
    case c10::ScalarType::UInt32:
      return fn(uint32_t{});
    case c10::ScalarType::UInt64:
      return fn(uint64_t{});
    case c10::ScalarType::Half:
      return fn(c10::Half{});
    case c10::ScalarType::BFloat16:
      return fn(c10::BFloat16{});
    case c10::ScalarType::Float:
      return fn(float{});
    default:
      return fn(double{});
  }
}

}  // namespace pinstage
