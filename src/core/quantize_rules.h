// The quantizers' per-value rules (docs/decode.md, "Quantizers"), in integer arithmetic on float
// bits plus one float division or exact multiplication, so that the CPU quantizer and the CUDA
// one write the same bytes; constexpr, so a CUDA kernel calls them (--expt-relaxed-constexpr).
#pragma once
#include <bit>
#include <cstdint>

#include "core/numeric.h"

namespace smla::rules {

// A per-tensor fp8 value: x / kv_scale as an IEEE float division (so it rounds to float first:
// CUDA's `/` on floats is the same division unless built with fast math), then e4m3.
constexpr uint8_t e4m3_per_tensor(uint16_t x_bf16, float kv_scale) {
  return float_to_e4m3(bf16_to_float(x_bf16) / kv_scale);
}

// UE8M0 byte of a group with no finite non-zero value: scale 1.
constexpr uint8_t kDsMlaZeroGroupExponent = 127;
// UE8M0 byte of a group holding a NaN, NaN in UE8M0; its codes are all 0x7F (NaN), as a
// reference quantizer's amax and quotients would make them. Both decodes then read the group as
// non-finite (the CPU NaN; CUDA's bf16 conversion inf, docs/decode.md), so that the output of a
// row attending it is NaN, not a finite value.
constexpr uint8_t kDsMlaNanGroupExponent = 255;

// |x| of a bf16 as bf16 bits, for its group's scale: inf as 0 (it saturates, setting no scale),
// a NaN above every finite value. Non-negative bf16 bits order as their values do, so the
// integer max of these over a group is its largest finite |x|, or a NaN's.
constexpr uint16_t scale_magnitude(uint16_t x_bf16) {
  const uint16_t magnitude = x_bf16 & 0x7fffu;
  return magnitude == 0x7f80u ? 0 : magnitude;
}

// The UE8M0 byte e of the smallest scale 2^(e-127) with max_abs / scale <= 448 (the largest
// e4m3), so that no value of the group saturates; `max_abs` is the largest finite |x| of the
// group. With max_abs = 2^E * f, f in [1, 2): e = E + 119, plus 1 when f > 1.75 (448 = 1.75 * 2^8).
// Clamped below at 0 (max_abs < 2^-119: the group then fits with room to spare); bf16 and float
// maxima never need more than 247, so 255 is written only for a NaN group.
constexpr uint8_t ds_mla_scale_exponent(float max_abs) {
  const uint32_t a = std::bit_cast<uint32_t>(max_abs) & 0x7fffffffu;
  if (a == 0) return kDsMlaZeroGroupExponent;
  const int32_t e = static_cast<int32_t>(a >> 23) - 8 + ((a & 0x7fffffu) > 0x600000u ? 1 : 0);
  return static_cast<uint8_t>(e < 0 ? 0 : e);
}

// The same from a group's largest scale_magnitude (a NaN's: kDsMlaNanGroupExponent).
constexpr uint8_t ds_mla_group_exponent(uint16_t max_scale_magnitude) {
  if (max_scale_magnitude > 0x7f80u) return kDsMlaNanGroupExponent;
  return ds_mla_scale_exponent(bf16_to_float(max_scale_magnitude));
}

// 2^(127 - e), the factor that takes a group's values to its e4m3 range: exact in float for
// every e <= 253, and x * factor is exact unless it falls below 2^-126, where e4m3 is zero anyway.
// A NaN group's is NaN, so that every value's code is 0x7F.
constexpr float ds_mla_inverse_scale(uint8_t e) {
  if (e == kDsMlaNanGroupExponent) return std::bit_cast<float>(0x7fc00000u);
  return std::bit_cast<float>(static_cast<uint32_t>(254 - e) << 23);
}

// A NoPE value of a group whose scale byte has `inverse_scale` (ds_mla_inverse_scale).
constexpr uint8_t ds_mla_e4m3(uint16_t x_bf16, float inverse_scale) {
  return float_to_e4m3(bf16_to_float(x_bf16) * inverse_scale);
}

}  // namespace smla::rules
