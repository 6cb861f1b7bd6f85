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

// The nearest bf16 of a double, ties to even: rounded to a float first by round-to-odd, which
// keeps what a second rounding needs (a float has 16 more bits than a bf16), where the float's
// nearest could land on a bf16 tie and round twice.
constexpr uint16_t double_to_bf16(double value) {
  float f = static_cast<float>(value);  // nearest; overflow gives inf, NaN stays NaN
  if (static_cast<double>(f) != value && value == value) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if (value > 0 ? static_cast<double>(f) > value : static_cast<double>(f) < value) --u;
    f = std::bit_cast<float>(u | 1u);  // the odd one of the two floats around the value
  }
  return float_to_bf16(f);
}

// e4m3fn of a float: round to nearest even; magnitudes from 448 up (inf included) saturate to
// 448 of the same sign (the code past 448 is NaN: "satfinite", as cvt.rn.satfinite on the GPU);
// every NaN gives 0x7F (a NaN's sign is not portable: GPUs return a canonical NaN). Below 2^-6
// the result is a subnormal m * 2^-9, and zero keeps its sign.
constexpr uint8_t float_to_e4m3(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;  // |x| >= 448
  if (a >= 0x3c800000u) {                     // |x| >= 2^-6: 23 mantissa bits to 3, the carry
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // may bump the exponent (never past 448)
    return sign | static_cast<uint8_t>((r >> 20) - (120u << 3));
  }
  // |x| = mant * 2^(b - 150) with b = max(biased exponent, 1); m = |x| * 2^9 = mant >> shift,
  // rounded to nearest even. m = 8 is the smallest normal code, 0x08, as it should be.
  const uint32_t biased = a >> 23;
  const uint32_t mant = (a & 0x7fffffu) | (biased ? 0x800000u : 0u);
  const uint32_t shift = 141u - (biased ? biased : 1u);  // >= 21
  if (shift > 24) return sign;  // |x| < 2^-10 (mant < 2^24 is below half of 2^shift): zero
  const uint32_t m = (mant + (1u << (shift - 1)) - 1u + ((mant >> shift) & 1u)) >> shift;
  return sign | static_cast<uint8_t>(m);
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

// UE8M0 scale byte e = 2^(e-127), exactly (SPEC §2), as a double: e = 255 is 2^128 (NaN in
// the OCP spec), past every float, so that a zero code times it stays 0.
constexpr double ue8m0_to_double(uint8_t bits) {
  return std::bit_cast<double>(static_cast<uint64_t>(bits + 1023 - 127) << 52);
}

}  // namespace smla
