// Float64 decoding of the storage formats, written from their definitions and independent of
// the library's src/core/numeric.h (the oracle must not share the backend's mistakes).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace smla::test {

// bf16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
inline double ref_bf16(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exp = (bits >> 7) & 0xff, mant = bits & 0x7f;
  if (exp == 0xff)
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

// fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; S.1111.111 is NaN.
inline double ref_e4m3(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int exp = (bits >> 3) & 0xf, mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(mant, -9);
  return sign * std::ldexp(8 + mant, exp - 10);
}

// UE8M0 scale: 2^(e - 127) (SPEC §2).
inline double ref_ue8m0(uint8_t bits) { return std::ldexp(1.0, bits - 127); }

// Whether bf16 words hold a NaN: an element that kept the tests' 0xff poison.
inline bool any_bf16_nan(const void* data, size_t bytes) {
  for (size_t i = 0; i + 2 <= bytes; i += 2) {
    uint16_t bits;
    std::memcpy(&bits, static_cast<const char*>(data) + i, 2);
    if ((bits & 0x7fff) > 0x7f80) return true;
  }
  return false;
}

// Whether float32 words hold a NaN.
inline bool any_f32_nan(const void* data, size_t bytes) {
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    float x;
    std::memcpy(&x, static_cast<const char*>(data) + i, 4);
    if (std::isnan(x)) return true;
  }
  return false;
}

// Nearest bf16 (ties to even) of a finite value inside the bf16 range; for building inputs.
inline uint16_t to_bf16(double value) {
  const float f = static_cast<float>(value);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace smla::test
