// The quantizers' rules (docs/decode.md, "Quantizers") written as searches in float64, sharing
// no code with the library: the expected bytes of every row quantize_kv writes.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ref_numeric.h"

namespace smla::test {

// The e4m3 code nearest to v, ties to the even code; |v| >= 448 (inf too) gives +-448; NaN 0x7F.
inline uint8_t ref_nearest_e4m3(double v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::abs(v);
  if (a >= 448) return sign | 0x7e;
  static const std::array<double, 0x7f> values = [] {  // finite codes, increasing in value
    std::array<double, 0x7f> v{};
    for (int c = 0; c < 0x7f; ++c) v[c] = ref_e4m3(static_cast<uint8_t>(c));
    return v;
  }();
  const int above = static_cast<int>(std::lower_bound(values.begin(), values.end(), a) -
                                     values.begin());  // first code >= a; a < 448 = values[0x7e]
  if (above == 0) return sign;
  const double d_up = values[above] - a, d_down = a - values[above - 1];
  const int best = d_up < d_down   ? above
                   : d_down < d_up ? above - 1
                   : above % 2     ? above - 1
                                   : above;
  return sign | static_cast<uint8_t>(best);
}

// The UE8M0 byte of the smallest scale 2^(e-127) with max_abs / scale <= 448; 127 for 0.
inline uint8_t ref_ds_mla_exponent(double max_abs) {
  if (max_abs == 0) return 127;
  for (int e = 0; e < 255; ++e)
    if (max_abs / ref_ue8m0(static_cast<uint8_t>(e)) <= 448) return static_cast<uint8_t>(e);
  return 255;  // never for a finite bf16
}

// The bytes quantize_kv writes for one bf16 row: the record (1024 B bf16, 512 B e4m3, 576 B
// fp8_ds_mla) and, for fp8_ds_mla, the 8-B scale record.
struct RefRecord {
  std::vector<uint8_t> record, scales;
};

enum class RefLayout { bf16, e4m3, ds_mla };

inline RefRecord ref_quantize_row(RefLayout layout, const uint16_t* x, float kv_scale) {
  RefRecord r;
  if (layout == RefLayout::bf16) {
    r.record.resize(1024);
    std::memcpy(r.record.data(), x, 1024);
    return r;
  }
  if (layout == RefLayout::e4m3) {
    // The rule divides in float: the quotient rounds to float before it rounds to e4m3.
    for (int d = 0; d < 512; ++d)
      r.record.push_back(
          ref_nearest_e4m3(static_cast<float>(static_cast<float>(ref_bf16(x[d])) / kv_scale)));
    return r;
  }
  r.record.resize(576);
  r.scales.assign(8, 0);
  for (int g = 0; g < 7; ++g) {
    double max_abs = 0;
    bool nan = false;
    for (int d = g * 64; d < (g + 1) * 64; ++d) {
      nan |= std::isnan(ref_bf16(x[d]));
      if (std::isfinite(ref_bf16(x[d]))) max_abs = std::max(max_abs, std::abs(ref_bf16(x[d])));
    }
    // A NaN makes the whole group NaN: scale byte 255 (NaN in UE8M0), every code 0x7F.
    const uint8_t e = nan ? 255 : ref_ds_mla_exponent(max_abs);
    r.scales[g] = e;
    for (int d = g * 64; d < (g + 1) * 64; ++d)
      r.record[d] = nan ? 0x7f : ref_nearest_e4m3(ref_bf16(x[d]) / ref_ue8m0(e));
  }
  std::memcpy(r.record.data() + 448, x + 448, 128);
  return r;
}

}  // namespace smla::test
