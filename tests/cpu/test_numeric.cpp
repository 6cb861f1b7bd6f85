// The library's bit-level conversions (src/core/numeric.h) against the test tree's own float64
// decoders, over every code and the rounding corner cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/numeric.h"
#include "ref_numeric.h"
#include "ref_quantize.h"
#include "seed.h"

namespace smla::test {
namespace {

// Equal values, or both NaN.
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

TEST(Numeric, Bf16EveryCode) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits)
    ASSERT_TRUE(
        same(bf16_to_float(static_cast<uint16_t>(bits)), ref_bf16(static_cast<uint16_t>(bits))))
        << std::hex << bits;
}

TEST(Numeric, E4m3EveryCode) {
  for (uint32_t bits = 0; bits < 0x100; ++bits)
    ASSERT_TRUE(
        same(e4m3_to_float(static_cast<uint8_t>(bits)), ref_e4m3(static_cast<uint8_t>(bits))))
        << std::hex << bits;
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)) && std::isnan(e4m3_to_float(0xff)));
}

TEST(Numeric, Ue8m0EveryCode) {
  for (int e = 0; e < 256; ++e)
    ASSERT_EQ(ue8m0_to_double(static_cast<uint8_t>(e)), ref_ue8m0(static_cast<uint8_t>(e))) << e;
  EXPECT_EQ(ue8m0_to_double(255), 0x1p128);
  EXPECT_EQ(ue8m0_to_double(0), 0x1p-127);
}

// The nearest bf16 in float64 terms, ties to the even code; IEEE overflow: the code past the
// largest finite one (inf) counts as 2^128.
uint16_t nearest_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t down = static_cast<uint16_t>(u >> 16), up = static_cast<uint16_t>(down + 1);
  const double up_value = (up & 0x7fff) == 0x7f80 ? std::copysign(0x1p128, x) : ref_bf16(up);
  const double d_down = std::abs(ref_bf16(down) - x), d_up = std::abs(up_value - x);
  if (d_down != d_up) return d_down < d_up ? down : up;
  return (down & 1) ? up : down;
}

TEST(Numeric, FloatToBf16RoundsToNearestEven) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 gen(seed);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = gen();
    const float x = std::bit_cast<float>(u);
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(float_to_bf16(x), nearest_bf16(x)) << std::hex << u;
  }
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00008000u, 0x00018000u})
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(u)), nearest_bf16(std::bit_cast<float>(u)))
        << std::hex << u;
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // past bf16 max: inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = float_to_bf16(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(ref_bf16(nan)) && (nan & 0x8000));
  EXPECT_TRUE(
      std::isnan(ref_bf16(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // low-bit NaN
}

// From a double in one rounding: just above a bf16 tie rounds up, just below down, on it to even,
// where the float between would have been the tie itself.
TEST(Numeric, DoubleToBf16RoundsOnce) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 gen(seed);
  for (int i = 0; i < 200000; ++i) {
    const uint16_t code = static_cast<uint16_t>(gen() % 0x7f7f);  // finite, below the largest
    const uint16_t sign = static_cast<uint16_t>(gen() % 2 ? 0x8000 : 0);
    const double low = ref_bf16(code), high = ref_bf16(static_cast<uint16_t>(code + 1));
    const double tie = (low + high) / 2, nudge = (high - low) * 0x1p-30;
    const double s = sign ? -1 : 1;
    ASSERT_EQ(double_to_bf16(s * (tie + nudge)), (code + 1) | sign) << std::hex << code;
    ASSERT_EQ(double_to_bf16(s * (tie - nudge)), code | sign) << std::hex << code;
    ASSERT_EQ(double_to_bf16(s * tie), (code % 2 ? code + 1 : code) | sign) << std::hex << code;
    ASSERT_EQ(double_to_bf16(s * low), code | sign) << std::hex << code;
  }
  EXPECT_EQ(double_to_bf16(1 + 0x1p-8 + 0x1p-30), 0x3f81);  // float: exactly 1 + 2^-8, a tie
  EXPECT_EQ(double_to_bf16(1e300), 0x7f80);
  EXPECT_EQ(double_to_bf16(-1e300), 0xff80);
  EXPECT_EQ(double_to_bf16(0x1p-200), 0x0000);
  EXPECT_EQ(double_to_bf16(-0x1p-200), 0x8000);
  EXPECT_TRUE(std::isnan(ref_bf16(double_to_bf16(std::numeric_limits<double>::quiet_NaN()))));
}

TEST(Numeric, FloatToE4m3RoundsToNearestEvenAndSaturates) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {  // every bf16, so every binade and NaN
    const float x = bf16_to_float(static_cast<uint16_t>(bits));
    ASSERT_EQ(float_to_e4m3(x), ref_nearest_e4m3(x)) << std::hex << bits;
  }
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 gen(seed);
  for (int i = 0; i < 200000; ++i) {  // every mantissa bit matters for the ties
    const float x = std::bit_cast<float>(static_cast<uint32_t>(gen()));
    ASSERT_EQ(float_to_e4m3(x), ref_nearest_e4m3(x)) << std::hexfloat << x;
  }
  // Hand-computed: ties to even, saturation, subnormals, signed zero, NaN.
  const std::pair<float, uint8_t> cases[] = {
      {448.f, 0x7e},     {-448.f, 0xfe},      {464.f, 0x7e},    {480.f, 0x7e},
      {1e30f, 0x7e},     {-INFINITY, 0xfe},   {NAN, 0x7f},      {-NAN, 0x7f},
      {0.f, 0x00},       {-0.f, 0x80},        {1.f, 0x38},      {1.0625f, 0x38},
      {1.1875f, 0x3a},   {17.f, 0x58},        {0x1p-6f, 0x08},  {0x1p-9f, 0x01},
      {0x1p-10f, 0x00},  {0x1.02p-10f, 0x01}, {0x3p-10f, 0x02}, {0x5p-10f, 0x02},
      {0x7p-10f, 0x04},  {0xfp-10f, 0x08},    {-0x1p-9f, 0x81}, {0x1p-149f, 0x00},
      {0x1.ep-7f, 0x08}, {0x1.cp-7f, 0x07},   {432.f, 0x7e},    {431.f, 0x7d}};
  for (const auto& [x, code] : cases) EXPECT_EQ(float_to_e4m3(x), code) << std::hexfloat << x;
}

}  // namespace
}  // namespace smla::test
