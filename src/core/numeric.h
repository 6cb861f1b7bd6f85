// Bit-exact conversions between the storage formats (bf16, fp8 e4m3fn, UE8M0) and float.
#pragma once
#include <bit>
#include <cstdint>

namespace smla {

constexpr float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even; overflow gives inf, NaN stays a (quiet) NaN of the same sign.
constexpr uint16_t float_to_bf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// e4m3fn (OCP FP8): bias 7, subnormals m * 2^-9, no inf, 0x7F / 0xFF are NaN, max 448.
constexpr float e4m3_to_float(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exp = (bits >> 3) & 0xfu, mant = bits & 0x7u;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exp == 0) {
    const float magnitude = static_cast<float>(mant) * (1.0f / 512.0f);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
}

// UE8M0 scale byte e = 2^(e-127). e = 0 is the float subnormal 2^-127; e = 255 (2^128, NaN
// in the OCP spec) is not representable and gives inf.
constexpr float ue8m0_to_float(uint8_t bits) {
  return std::bit_cast<float>(bits ? static_cast<uint32_t>(bits) << 23 : 0x00400000u);
}

}  // namespace smla
