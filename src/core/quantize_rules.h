// fp8_ds_mla's scale rule (docs/decode.md, "Quantizers"), in integer arithmetic on float bits
// so that the CPU quantizer and a device one pick the same UE8M0 bytes; constexpr, so a CUDA
// kernel can call it (--expt-relaxed-constexpr).
#pragma once
#include <bit>
#include <cstdint>

namespace smla::rules {

// UE8M0 byte of a group with no finite non-zero value: scale 1.
constexpr uint8_t kDsMlaZeroGroupExponent = 127;

// The UE8M0 byte e of the smallest scale 2^(e-127) with max_abs / scale <= 448 (the largest
// e4m3), so that no value of the group saturates; `max_abs` is the largest finite |x| of the
// group. With max_abs = 2^E * f, f in [1, 2): e = E + 119, plus 1 when f > 1.75 (448 = 1.75 * 2^8).
// Clamped below at 0 (max_abs < 2^-119: the group then fits with room to spare); bf16 and float
// maxima never need more than 247, so 255 (not a number in UE8M0) is never written.
constexpr uint8_t ds_mla_scale_exponent(float max_abs) {
  const uint32_t a = std::bit_cast<uint32_t>(max_abs) & 0x7fffffffu;
  if (a == 0) return kDsMlaZeroGroupExponent;
  const int32_t e = static_cast<int32_t>(a >> 23) - 8 + ((a & 0x7fffffu) > 0x600000u ? 1 : 0);
  return static_cast<uint8_t>(e < 0 ? 0 : e);
}

// 2^(127 - e), the factor that takes a group's values to its e4m3 range: exact in float for
// every e <= 253, and x * factor is exact unless it falls below 2^-126, where e4m3 is zero anyway.
constexpr float ds_mla_inverse_scale(uint8_t e) {
  return std::bit_cast<float>(static_cast<uint32_t>(254 - e) << 23);
}

}  // namespace smla::rules
