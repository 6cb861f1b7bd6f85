// quantize_kv (docs/decode.md, "Quantizers") against the test tree's float64 searches
// (ref_quantize.h): hand-computed codes, every bf16 value, every UE8M0 exponent, packed pages
// and padding slots byte for byte, the round trip through the test decoder, and the decode op
// fed by quantized pools against the oracle. Random inputs replay with SMLA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "caller_fp_modes.h"
#include "core/quantize_problem.h"
#include "cpu/quantize.h"
#include "oracle.h"
#include "quantize_inputs.h"
#include "ref_quantize.h"
#include "smla/decode.h"
#include "smla/quantize.h"

namespace smla::test {
namespace {

constexpr uint16_t kInf = 0x7f80, kNegInf = 0xff80, kNan = 0x7fc0, kNegNan = 0xffc0;

TensorView host_view(const HostTensor& t) {
  return t.view(const_cast<std::byte*>(t.bytes.data()), Device{});
}

HostTensor blank_pool(const PoolShape& shape) { return filled_pool(shape, std::byte{0xff}); }

PoolShape one_page(KvLayout layout, int64_t block_size) {
  return {.layout = layout, .num_blocks = 1, .block_size = block_size};
}

void quantize(const Rows& rows, const std::vector<int32_t>& slots, HostTensor& pool,
              float kv_scale = 1.0f) {
  HostTensor s = HostTensor::make(DType::i32, {static_cast<int64_t>(slots.size())});
  for (size_t i = 0; i < slots.size(); ++i) s.set<int32_t>(i, slots[i]);
  quantize_kv(host_view(rows.t), host_view(s), host_view(pool), kv_scale);
}

std::vector<int32_t> first_slots(int64_t n) {
  std::vector<int32_t> s(n);
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>(i);
  return s;
}

// SPEC §4 from the test's own geometry: slot -> storage offset.
int64_t offset_of(const RefPool& pool, int64_t slot) {
  return slot / pool.block_size * pool.span + slot % pool.block_size;
}

std::string hex(int value) {
  char s[8];  // "0x" and up to 4 hex digits
  std::snprintf(s, sizeof s, "0x%02x", value);
  return s;
}

// Every row with a non-negative slot is in the pool as ref_quantize_row's bytes, and every
// other byte of the pool is still 0xFF.
::testing::AssertionResult holds_exactly(const HostTensor& pool, const Rows& rows,
                                         const std::vector<int32_t>& slots, float kv_scale) {
  const RefPool ref(pool);
  const RefLayout layout = pool.dtype == DType::u8     ? RefLayout::ds_mla
                           : pool.dtype == DType::bf16 ? RefLayout::bf16
                                                       : RefLayout::e4m3;
  std::vector<bool> written(pool.bytes.size(), false);
  int64_t mismatches = 0;
  std::ostringstream bad;
  auto compare = [&](int64_t at, const std::vector<uint8_t>& want, int64_t i, const char* what) {
    for (size_t k = 0; k < want.size(); ++k) {
      written[at + k] = true;
      const uint8_t got = pool.load<uint8_t>(at + static_cast<int64_t>(k));
      if (got != want[k] && mismatches++ < 8)
        bad << "\n  row " << i << " (slot " << slots[i] << ") " << what << " byte " << k << " = "
            << hex(got) << ", expected " << hex(want[k]);
    }
  };
  for (int64_t i = 0; i < rows.size(); ++i) {
    if (slots[i] < 0) continue;
    const RefRecord r = ref_quantize_row(layout, rows.row(i), kv_scale);
    const int64_t offset = offset_of(ref, slots[i]);
    compare(ref.record(offset), r.record, i, "record");
    if (!r.scales.empty()) compare(ref.scale_record(offset), r.scales, i, "scale record");
  }
  for (size_t b = 0; b < pool.bytes.size(); ++b)
    if (!written[b] && pool.bytes[b] != std::byte{0xff} && mismatches++ < 8)
      bad << "\n  byte " << b << " of the pool, which no row owns, was written";
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " bad bytes" << bad.str();
}

// A random bf16 of magnitude ~2^shift, now and then zero, subnormal, inf or NaN (`specials`).
uint16_t random_bf16(Rng& rng, int shift, bool specials) {
  if (specials && rng.chance(0.02)) {
    const uint16_t s[] = {0x0000, 0x8000, 0x0001, 0x8003, kInf, kNegInf, kNan, kNegNan, 0x7f7f};
    return s[rng.uniform(0, 8)];
  }
  return to_bf16(std::ldexp(rng.normal(), shift));
}

// Random rows whose 64-value groups each have their own magnitude 2^[lo, hi].
void fill_random(Rows& rows, Rng& rng, int lo, int hi, bool specials) {
  for (int64_t i = 0; i < rows.size(); ++i)
    for (int g = 0; g < 8; ++g) {
      const int shift = static_cast<int>(rng.uniform(lo, hi));
      for (int d = g * 64; d < (g + 1) * 64; ++d)
        rows.row(i)[d] = random_bf16(rng, shift, specials);
    }
}

TEST(Quantize, HandComputedE4m3) {
  struct Case {
    uint16_t x;  // bf16
    float kv_scale;
    uint8_t code;
  };
  const Case cases[] = {
      {0x43e0, 1, 0x7e},  // 448: the largest e4m3
      {0xc3e0, 1, 0xfe},  // -448
      {0x43e8, 1, 0x7e},  // 464: the tie between 448 and (NaN) 480 goes to 448
      {0x43f0, 1, 0x7e},  // 480 saturates
      {0x461c, 1, 0x7e},  // 9984 saturates
      {0x7f7f, 1, 0x7e},  // the largest bf16 saturates
      {kInf, 1, 0x7e},    // inf saturates
      {kNegInf, 1, 0xfe},
      {kNan, 1, 0x7f},
      {kNegNan, 1, 0x7f},
      {0x0000, 1, 0x00},
      {0x8000, 1, 0x80},            // -0 keeps its sign
      {0x3f80, 1, 0x38},            // 1
      {0x3f88, 1, 0x38},            // 1.0625: tie between 1 and 1.125 goes to the even 1
      {0x3f98, 1, 0x3a},            // 1.1875: tie between 1.125 and 1.25 goes to the even 1.25
      {0x4188, 1, 0x58},            // 17: tie between 16 and 18 goes to 16
      {0x43d7, 1, 0x7d},            // 430: nearer 416 than 448
      {0x3c80, 1, 0x08},            // 2^-6: the smallest normal
      {0x3b00, 1, 0x01},            // 2^-9: the smallest subnormal
      {0x3a80, 1, 0x00},            // 2^-10: tie between 0 and 2^-9 goes to 0
      {0x3a81, 1, 0x01},            // just above 2^-10
      {0x3b40, 1, 0x02},            // 3 * 2^-10 = 1.5 subnormal steps: to 2
      {0x3b20, 1, 0x01},            // 1.25 steps: to 1
      {0x3ba0, 1, 0x02},            // 5 * 2^-10 = 2.5 steps: to 2
      {0x3be0, 1, 0x04},            // 7 * 2^-10 = 3.5 steps: to 4
      {0x3c70, 1, 0x08},            // 15 * 2^-10 = 7.5 steps: to 8, the smallest normal
      {0xbb00, 1, 0x81},            // -2^-9
      {0x0001, 1, 0x00},            // the smallest bf16 subnormal
      {0x3f80, 0.5f, 0x40},         // 1 / 0.5 = 2
      {0x4040, 3, 0x38},            // 3 / 3 = 1
      {0x3f80, 3, 0x2b},            // 1 / 3 -> 0.34375
      {0x3f80, 1.0f / 1024, 0x7e},  // 1024 saturates
      // 1.1484375 / 69.176468 rounds to the float 1.0625 * 2^-6, the tie between e4m3 2^-6 and
      // 1.125 * 2^-6, which goes to the even 2^-6; times the rounded 1 / kv_scale it would land
      // just above the tie, at 0x09. The division, not a multiplication, is the rule.
      {0x3f93, std::bit_cast<float>(0x428a5a5au), 0x08},
  };
  for (const Case& c : cases) {
    Rows row(1);
    std::fill(row.row(0), row.row(0) + 512, uint16_t{0});
    row.row(0)[0] = c.x;
    HostTensor pool = blank_pool(one_page(KvLayout::fp8_e4m3, 1));
    quantize(row, {0}, pool, c.kv_scale);
    EXPECT_EQ(hex(pool.load<uint8_t>(0)), hex(c.code))
        << "bf16 " << hex(c.x) << " / kv_scale " << c.kv_scale;
    EXPECT_EQ(pool.load<uint8_t>(1), 0x00);
  }
}

TEST(Quantize, HandComputedDsMla) {
  Rows rows(2);
  std::fill(rows.row(0), rows.row(0) + 512, uint16_t{0});
  std::fill(rows.row(1), rows.row(1) + 512, uint16_t{0});
  uint16_t* x = rows.row(0);
  // Group 0 is all zero. Group 1: max 448 fits at scale 1.
  x[64] = 0x43e0, x[65] = 0x3f80, x[66] = 0xbb00;
  // Group 2: max 450 needs scale 2: 450 / 2 = 225 -> 224; -1 / 2 = -0.5.
  x[128] = 0x43e1, x[129] = 0xbf80;
  // Group 3: max 1 takes scale 2^-8 (256 <= 448; 2^-9 would give 512).
  x[192] = 0x3f80, x[193] = 0x3f00;
  // Group 4: the smallest bf16 subnormals; the scale clamps at 2^-127: +-2^-6.
  x[256] = 0x0001, x[257] = 0x8001;
  // Group 5: max 3 of the finite values: scale 2^-7, 3 -> 384; -inf saturates.
  x[320] = 0x4040, x[321] = kNegInf;
  // Group 6: a NaN makes the group NaN: scale byte 255 (NaN in UE8M0), every code 0x7F.
  x[384] = 0x3f80, x[385] = kNegNan;
  const uint16_t rope[] = {0x7fc1, 0xff80, 0x0001, 0x3f80, 0x8000, 0x7f7f};
  std::copy(std::begin(rope), std::end(rope), x + 448);

  uint16_t* y = rows.row(1);
  y[0] = 0x7f7f, y[1] = 0xff7f;  // the largest bf16: scale 2^120, (2 - 2^-7) * 2^7 -> 256
  y[64] = 0x4660;                // 448 * 2^5 exactly: scale 2^5
  y[128] = 0x4661;               // the next bf16: scale 2^6, 14400 / 64 = 225 -> 224
  y[192] = 0x0460;               // 448 * 2^-127 exactly: UE8M0 byte 0
  y[256] = 0x0461;               // the next bf16: byte 1, 225 -> 224

  HostTensor pool = blank_pool(one_page(KvLayout::fp8_ds_mla, 2));
  quantize(rows, {0, 1}, pool);
  const RefPool ref(pool);
  auto code = [&](int64_t slot, int d) { return hex(pool.load<uint8_t>(ref.record(slot) + d)); };
  auto scale = [&](int64_t slot, int g) { return pool.load<uint8_t>(ref.scale_record(slot) + g); };
  const uint8_t exponents[2][8] = {{127, 127, 128, 119, 0, 120, 255, 0},
                                   {247, 132, 133, 0, 1, 127, 127, 0}};
  for (int r = 0; r < 2; ++r)
    for (int g = 0; g < 8; ++g)
      EXPECT_EQ(scale(r, g), exponents[r][g]) << "row " << r << " g " << g;
  EXPECT_EQ(code(0, 0), "0x00");
  EXPECT_EQ(code(0, 64), "0x7e");
  EXPECT_EQ(code(0, 65), "0x38");
  EXPECT_EQ(code(0, 66), "0x81");
  EXPECT_EQ(code(0, 128), "0x76");
  EXPECT_EQ(code(0, 129), "0xb0");
  EXPECT_EQ(code(0, 192), "0x78");
  EXPECT_EQ(code(0, 193), "0x70");
  EXPECT_EQ(code(0, 256), "0x08");
  EXPECT_EQ(code(0, 257), "0x88");
  EXPECT_EQ(code(0, 320), "0x7c");
  EXPECT_EQ(code(0, 321), "0xfe");
  EXPECT_EQ(code(0, 322), "0x00");
  for (int d = 384; d < 448; ++d) EXPECT_EQ(code(0, d), "0x7f") << d;
  EXPECT_EQ(code(1, 0), "0x78");
  EXPECT_EQ(code(1, 1), "0xf8");
  EXPECT_EQ(code(1, 64), "0x7e");
  EXPECT_EQ(code(1, 128), "0x76");
  EXPECT_EQ(code(1, 192), "0x7e");
  EXPECT_EQ(code(1, 256), "0x76");
  for (int d = 0; d < 64; ++d)  // RoPE: the bf16 bits, NaN payloads included
    EXPECT_EQ(pool.load<uint16_t>(ref.record(0) + 448 + 2 * d), x[448 + d]) << d;
  EXPECT_TRUE(holds_exactly(pool, rows, {0, 1}, 1.0f));
}

TEST(Quantize, EveryBf16ValueE4m3) {
  Rows rows(128);  // 65536 values: every bf16 code once
  for (int64_t i = 0; i < 128; ++i)
    for (int d = 0; d < 512; ++d) rows.row(i)[d] = static_cast<uint16_t>(i * 512 + d);
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const float random_scale = static_cast<float>(std::exp(rng.real(-10, 10)));
  for (float kv_scale : {1.0f, 0.5f, 3.0f, 1.0f / 448, 7.5e5f, 1e-30f, random_scale}) {
    HostTensor pool = blank_pool(one_page(KvLayout::fp8_e4m3, 128));
    quantize(rows, first_slots(128), pool, kv_scale);
    EXPECT_TRUE(holds_exactly(pool, rows, first_slots(128), kv_scale))
        << "kv_scale " << kv_scale << " (seed " << seed << ")";
  }
}

#ifdef SMLA_TEST_CALLER_FP_MODES
// A caller's float modes (torch.set_flush_denormal(True)'s flush-to-zero and denormals-are-zero,
// fesetround's directions) change no byte: subnormal values, a subnormal kv_scale and quotients
// next to a rounding midpoint round as on the GPU, on the caller's thread and the workers alike;
// the caller's mode is back afterwards.
TEST(Quantize, FloatModesOfTheCallerChangeNoByte) {
  Rows rows(600);  // three tasks of 256 rows: worker threads where there are CPUs
  for (int64_t i = 0; i < rows.size(); ++i)
    for (int d = 0; d < 512; ++d)  // bf16 subnormals, some groups of nothing else
      rows.row(i)[d] = static_cast<uint16_t>((d % 3 == 0 && i % 2 ? 0x3f80 : 0x0001 + d % 127) |
                                             (d % 2 ? 0x8000 : 0));
  const float subnormal_scale = std::ldexp(1.0f, -130);
  // 1 / kv_scale a little above e4m3's midpoint 1.0625: 1.0's quotient rounds down to it (then
  // to even, 1.0) or up past it (1.125), by the rounding direction.
  const float near_midpoint_scale = std::nextafter(1 / 1.0625f, 0.0f);
  for (KvLayout layout : {KvLayout::fp8_e4m3, KvLayout::fp8_ds_mla})
    for (float kv_scale : {1.0f, subnormal_scale, near_midpoint_scale}) {
      HostTensor ieee = blank_pool(one_page(layout, rows.size()));
      quantize(rows, first_slots(rows.size()), ieee, kv_scale);
      for (const CallerFpMode& mode : kCallerFpModes) {
        HostTensor moded = blank_pool(one_page(layout, rows.size()));
        EXPECT_TRUE(under_caller_mode(mode, [&] {
          quantize(rows, first_slots(rows.size()), moded, kv_scale);
        })) << mode.name;
        EXPECT_TRUE(moded.bytes == ieee.bytes)
            << mode.name << ", " << kv_layout_name(layout) << " " << kv_scale;
      }
      EXPECT_TRUE(holds_exactly(ieee, rows, first_slots(rows.size()), kv_scale));
    }
}
#endif

// Groups whose maxima are every positive finite bf16, so every UE8M0 byte a bf16 row can need
// (0..247) is chosen at least once, each by the smallest-power-of-two rule.
TEST(Quantize, EveryUe8m0ExponentDsMla) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  // Smaller values of either sign, now and then an infinity (a NaN would make its group NaN,
  // scale byte 255: HandComputedDsMla).
  const Rows rows = rows_with_every_group_maximum(
      rng, 0,
      [&](uint16_t m) {
        return rng.chance(0.03) ? (rng.chance(0.5) ? kInf : kNegInf)
                                : to_bf16(ref_bf16(m) * rng.real(-1, 1));
      },
      [&] { return random_bf16(rng, 0, true); });
  const int64_t n = rows.size();
  const PoolShape shape{
      .layout = KvLayout::fp8_ds_mla, .num_blocks = (n + 63) / 64, .block_size = 64};
  HostTensor pool = blank_pool(shape);
  std::vector<int32_t> slots = first_slots(n);
  std::shuffle(slots.begin(), slots.end(), rng.engine());
  quantize(rows, slots, pool);
  EXPECT_TRUE(holds_exactly(pool, rows, slots, 1.0f)) << "seed " << seed;
  const RefPool ref(pool);
  std::set<int> used;
  for (int64_t slot = 0; slot < n; ++slot)
    for (int g = 0; g < 7; ++g) used.insert(pool.load<uint8_t>(ref.scale_record(slot) + g));
  EXPECT_EQ(used.size(), 248u);
  EXPECT_EQ(*used.begin(), 0);
  EXPECT_EQ(*used.rbegin(), 247);
}

// Random pages (packed with other data, padded token strides, rank 4), rows written to a
// shuffled subset of the slots with padding slots between them: exactly the rows' bytes land,
// nothing else changes.
TEST(Quantize, PackedPagesAndPaddingSlots) {
  for (KvLayout layout : kKvLayouts)
    for (int round = 0; round < 6; ++round) {
      const uint64_t seed = fresh_seed();
      Rng rng(seed);
      const PoolShape shape = quantize_pool_shape(rng, layout, round);
      HostTensor pool = blank_pool(shape);
      const std::vector<int32_t> slots = random_slots(rng, shape, 0.7);
      Rows rows(static_cast<int64_t>(slots.size()), rng.chance(0.5) ? 64 : 0);
      fill_random(rows, rng, -20, 20, true);
      const float kv_scale = static_cast<float>(std::exp(rng.real(-4, 4)));
      quantize(rows, slots, pool, kv_scale);
      EXPECT_TRUE(holds_exactly(pool, rows, slots, kv_scale))
          << shape.describe() << " " << seed_note(seed);
    }
}

// Half an e4m3 step at |v| < 448: 2^-10 among the subnormals, else 2^(floor(log2 |v|) - 4).
double half_step(double v) {
  const double a = std::abs(v);
  return a < 0x1p-6 ? 0x1p-10 : std::ldexp(1.0, std::ilogb(a) - 4);
}

// Quantized and decoded (by oracle.h's decoder), every finite value is within half an e4m3
// step of itself, at its scale; RoPE values and bf16 pools come back exactly.
TEST(Quantize, RoundTripWithinHalfAStep) {
  for (KvLayout layout : kKvLayouts) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const float kv_scale =
        layout == KvLayout::fp8_e4m3 ? static_cast<float>(std::exp(rng.real(-6, 6))) : 1.0f;
    const PoolShape shape = random_pool_shape(rng, layout);
    HostTensor pool = blank_pool(shape);
    Rows rows(shape.num_blocks * shape.block_size);
    if (layout == KvLayout::fp8_e4m3) {  // within +-448 * kv_scale: no saturation
      for (int64_t i = 0; i < rows.size(); ++i)
        for (int d = 0; d < 512; ++d)
          rows.row(i)[d] = to_bf16(
              kv_scale * std::ldexp(rng.real(-1, 1), static_cast<int>(rng.uniform(-12, 8))));
    } else {
      fill_random(rows, rng, -40, 40, false);
    }
    quantize(rows, first_slots(rows.size()), pool, kv_scale);
    const RefPool ref(pool);
    int64_t bad = 0;
    for (int64_t slot = 0; slot < rows.size() && bad < 8; ++slot) {
      const auto got = ref.row(offset_of(ref, slot));
      const uint16_t* x = rows.row(slot);
      double scales[8] = {1, 1, 1, 1, 1, 1, 1, 1};
      if (layout == KvLayout::fp8_ds_mla)
        for (int g = 0; g < 7; ++g)
          scales[g] = ref_ue8m0(pool.load<uint8_t>(ref.scale_record(offset_of(ref, slot)) + g));
      for (int d = 0; d < 512; ++d) {
        const double want = ref_bf16(x[d]);
        double value = got[d], bound = 0;
        if (layout == KvLayout::fp8_e4m3) {
          value *= kv_scale;  // the decode op applies kv_scale through bmm1/bmm2_scale
          // The float quotient x / kv_scale is itself rounded (relative 2^-24).
          bound = kv_scale * half_step(want / kv_scale) + std::abs(want) * 0x1p-23;
        } else if (layout == KvLayout::fp8_ds_mla && d < 448) {
          bound = scales[d / 64] * half_step(want / scales[d / 64]);
        }
        if (!(std::abs(value - want) <= bound) && bad++ < 8)
          ADD_FAILURE() << kv_layout_name(layout) << " slot " << slot << " d " << d << ": " << want
                        << " came back as " << value << " (bound " << bound << ", seed " << seed
                        << ")";
      }
    }
  }
}

// The backend reads the slots again after validate_quantize checked them. Slots changed in
// between (by another thread: a race the caller owns) to past the pool are skipped: the pool and
// the guard bytes after it stay as they were.
TEST(Quantize, SlotsChangedAfterValidationWriteNothingOutsideThePool) {
  for (const KvLayout layout : {KvLayout::bf16, KvLayout::fp8_e4m3, KvLayout::fp8_ds_mla}) {
    SCOPED_TRACE(kv_layout_name(layout));
    const PoolShape shape = one_page(layout, 4);
    HostTensor pool = filled_pool(shape, std::byte{0xab});
    const int64_t pool_bytes = static_cast<int64_t>(pool.bytes.size());
    pool.bytes.resize(2 * pool_bytes, std::byte{0xab});  // guard bytes after the pool
    Rows rows(2);
    std::fill(rows.row(0), rows.row(2), uint16_t{0x3f80});  // 1.0
    HostTensor slots = HostTensor::make(DType::i32, {2});
    slots.set<int32_t>(0, 0), slots.set<int32_t>(1, 3);
    const TensorView slot_view = host_view(slots), pool_view = host_view(pool);
    const QuantizeProblem problem =
        validate_quantize(host_view(rows.t), slot_view, pool_view, 1.0f);
    slots.set<int32_t>(0, 4), slots.set<int32_t>(1, 1 << 28);  // one past the pool, far past it
    cpu::quantize_kv(problem, host_view(rows.t), slot_view);
    EXPECT_TRUE(std::all_of(pool.bytes.begin(), pool.bytes.end(),
                            [](std::byte b) { return b == std::byte{0xab}; }));
  }
}

// The decode op reading pools that quantize_kv filled (every pool layout and sharing, packed
// pages) agrees with the float64 oracle on the dequantized values.
TEST(Quantize, DecodeOfQuantizedPoolsMatchesOracle) {
  struct Variant {
    KvLayout layout;
    DType query;
  };
  const Variant variants[] = {{KvLayout::bf16, DType::bf16},
                              {KvLayout::fp8_e4m3, DType::bf16},
                              {KvLayout::fp8_e4m3, DType::f8e4m3},
                              {KvLayout::fp8_ds_mla, DType::bf16}};
  for (const Variant& v : variants)
    for (PoolSharing sharing : {PoolSharing::absent, PoolSharing::same, PoolSharing::separate}) {
      const uint64_t seed = fresh_seed();
      DecodeCase c = make_case(
          {.layout = v.layout, .query_dtype = v.query, .heads = 16, .pools = sharing}, seed);
      Rng rng(seed ^ 0x9a4e);
      const float kv_scale = v.layout == KvLayout::fp8_e4m3 ? 0.25f : 1.0f;
      Moments kv;
      for (HostTensor* pool : {&c.swa_kv_cache, &c.compressed_kv_cache}) {
        if (!pool->defined()) continue;
        const RefPool ref(*pool);
        Rows rows(ref.blocks * ref.block_size);
        fill_random(rows, rng, -6, 6, false);
        quantize(rows, first_slots(rows.size()), *pool, kv_scale);
        for (int64_t slot = 0; slot < rows.size(); ++slot)
          for (double x : ref.row(offset_of(ref, slot))) kv.add(x);
      }
      if (sharing == PoolSharing::same) c.compressed_kv_cache = c.swa_kv_cache;
      Moments q;
      for (int64_t t = 0; t < c.query.size(0); ++t)
        for (int64_t i = 0; i < c.query.size(1) * 512; ++i) {
          const int64_t at = t * c.query.stride(0) + i;
          q.add(v.query == DType::bf16 ? ref_bf16(c.query.get<uint16_t>(at))
                                       : ref_e4m3(c.query.get<uint8_t>(at)));
        }
      c.bmm1_scale = static_cast<float>(rng.real(0.5, 3) / (q.rms() * kv.rms() * std::sqrt(512)));
      c.bmm2_scale = kv_scale;
      poison_unattended_rows(c);
      ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
      EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
    }
}

}  // namespace
}  // namespace smla::test
