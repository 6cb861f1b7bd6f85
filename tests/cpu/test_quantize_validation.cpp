// Every bad quantize_kv argument gets its own smla::Error: the right kind, the parameter's name
// as argument(), a message that says what was expected and what came, and an untouched pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "address_space_cap.h"
#include "core/sanitizers.h"
#include "error_check.h"
#include "host_case.h"
#include "smla/error.h"
#include "smla/quantize.h"

namespace smla::test {
namespace {

constexpr Device kCuda{DeviceKind::cuda, 0};
constexpr int64_t kBlocks = 3, kBlockSize = 4, kRows = 5;

// A valid call (5 rows into an fp8_e4m3 pool of 3 pages of 4 rows, one padding slot) that each
// test breaks in one way; `pool_bytes` is the pool before the call.
class QuantizeValidation : public ::testing::Test {
 protected:
  std::vector<std::byte> row_bytes = std::vector<std::byte>(kRows * 512 * 2, std::byte{0x3f});
  std::vector<int32_t> slot_values = {0, 11, -1, 4, 7};
  std::vector<std::byte> pool_bytes = std::vector<std::byte>(kBlocks * kBlockSize * 512);
  // Behind hand-made views, each inside it (the widest spans 125 * 576 + 1168 B): a view past
  // it could overlap the fixture's other buffers, as the test below then did in 1 run of some.
  std::vector<std::byte> scratch = std::vector<std::byte>(1 << 17);
  TensorView rows = make_view(row_bytes.data(), DType::bf16, Device{}, {kRows, 512});
  TensorView slots = make_view(slot_values.data(), DType::i32, Device{}, {kRows});
  TensorView pool =
      make_view(pool_bytes.data(), DType::f8e4m3, Device{}, {kBlocks, kBlockSize, 512});
  float kv_scale = 0.5f;

  void SetUp() override { std::fill(pool_bytes.begin(), pool_bytes.end(), std::byte{0xab}); }

  TensorView view(DType dtype, std::initializer_list<int64_t> shape) {
    return make_view(scratch.data(), dtype, Device{}, shape);
  }

  // quantize_kv throws kind / argument, what() quotes `expected` and `got`, the pool is intact.
  void expect_error(ErrorKind kind, const std::string& argument, const std::string& expected,
                    const std::string& got) {
    const std::vector<std::byte> before = pool_bytes;
    test::expect_smla_error([&] { quantize_kv(rows, slots, pool, kv_scale); }, kind, argument,
                            expected, got);
    EXPECT_TRUE(pool_bytes == before) << "the pool was written before the error";
  }
};

TEST_F(QuantizeValidation, TheValidCallWritesItsRows) {
  ASSERT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale));
  // 0x3f3f / 0.5 in e4m3 is 1.5 (0x3c); slot 11 is page 2, row 3.
  for (int32_t slot : {0, 4, 7, 11}) EXPECT_EQ(pool_bytes[slot * 512 + 100], std::byte{0x3c});
  for (int32_t slot : {1, 2, 3, 5, 6, 8, 9, 10})
    EXPECT_EQ(pool_bytes[slot * 512 + 100], std::byte{0xab}) << slot;
}

TEST_F(QuantizeValidation, NoRowsIsANoOp) {
  rows = view(DType::bf16, {0, 512});
  slots = view(DType::i32, {0});
  const std::vector<std::byte> before = pool_bytes;
  ASSERT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale));
  EXPECT_TRUE(pool_bytes == before);
}

TEST_F(QuantizeValidation, RowsAbsent) {
  rows = TensorView{};
  expect_error(ErrorKind::value, "rows", "[N, 512]", "absent");
}

TEST_F(QuantizeValidation, RowsWrongDtype) {
  rows = view(DType::f32, {kRows, 512});
  expect_error(ErrorKind::type, "rows", "bf16", "f32");
}

TEST_F(QuantizeValidation, RowsWrongShape) {
  rows = view(DType::bf16, {kRows, 448});
  expect_error(ErrorKind::value, "rows", "[N, 512]", "[5, 448]");
  rows = view(DType::bf16, {kRows, 1, 512});
  expect_error(ErrorKind::value, "rows", "[N, 512]", "[5, 1, 512]");
}

TEST_F(QuantizeValidation, RowsNotContiguous) {
  rows = make_view(scratch.data(), DType::bf16, Device{}, {kRows, 512}, {1024, 2});
  expect_error(ErrorKind::value, "rows", "contiguous last dim", "stride 2");
}

TEST_F(QuantizeValidation, RowsOnAnotherDevice) {
  rows.device = kCuda;
  expect_error(ErrorKind::type, "rows", "cpu (the device of the call)", "cuda:0");
}

TEST_F(QuantizeValidation, SlotsAbsent) {
  slots = TensorView{};
  expect_error(ErrorKind::value, "slots", "[N = 5]", "absent");
}

TEST_F(QuantizeValidation, SlotsWrongDtype) {
  slots = view(DType::u8, {kRows});
  expect_error(ErrorKind::type, "slots", "i32", "u8");
}

TEST_F(QuantizeValidation, SlotsWrongLength) {
  slots = view(DType::i32, {kRows + 1});
  expect_error(ErrorKind::value, "slots", "[N = 5]", "[6]");
}

TEST_F(QuantizeValidation, SlotsOnAnotherDevice) {
  slots.device = kCuda;
  expect_error(ErrorKind::type, "slots", "cpu (the device of the call)", "cuda:0");
}

TEST_F(QuantizeValidation, SlotOutOfThePool) {
  slot_values[4] = kBlocks * kBlockSize;
  expect_error(ErrorKind::value, "slots", "[0, num_blocks * block_size = 12)", "slots[4] = 12");
}

TEST_F(QuantizeValidation, SlotsNotAlignedToTheirElements) {
  slots.data = static_cast<std::byte*>(slots.data) + 2;
  expect_error(ErrorKind::value, "slots", "data aligned to its 4-byte elements",
               "an address 2 bytes past a multiple of 4");
}

// One row alone is checked as well (a row count's special cases must not skip the slots).
TEST_F(QuantizeValidation, SlotOutOfThePoolInACallOfOneRow) {
  rows = make_view(row_bytes.data(), DType::bf16, Device{}, {1, 512});
  for (const int32_t slot : {int32_t(kBlocks * kBlockSize), std::numeric_limits<int32_t>::max()}) {
    slot_values[0] = slot;
    slots = make_view(slot_values.data(), DType::i32, Device{}, {1});
    expect_error(ErrorKind::value, "slots", "[0, num_blocks * block_size = 12)",
                 "slots[0] = " + std::to_string(slot));
  }
}

// A packed page's other rows are not slots: slot 12 is out even though the view spans more rows.
TEST_F(QuantizeValidation, SlotOutOfAPackedPool) {
  pool = make_view(pool_bytes.data(), DType::f8e4m3, Device{}, {2, 2, 512}, {6 * 512, 512, 1});
  slot_values = {0, 3, -1, 1, 4};
  expect_error(ErrorKind::value, "slots", "num_blocks * block_size = 4", "slots[4] = 4");
}

// Any slot twice, the smallest (0 here) too.
TEST_F(QuantizeValidation, SlotWrittenTwice) {
  const std::vector<int32_t> valid = slot_values;
  for (const auto& [i, slot, got] : {std::tuple{3, 11, "slots[1] = 11 and slots[3] = 11"},
                                     {4, 0, "slots[0] = 0 and slots[4] = 0"}}) {
    slot_values = valid;
    slot_values[i] = slot;
    expect_error(ErrorKind::value, "slots", "distinct slots", got);
  }
}

// Slots are read at their stride: every other element, those between a duplicate of slot 0 (a
// call reading them would refuse it).
TEST_F(QuantizeValidation, SlotsReadAtTheirStride) {
  std::vector<int32_t> strided(2 * kRows, 0);
  for (int64_t i = 0; i < kRows; ++i) strided[2 * i] = slot_values[i];
  slots = make_view(strided.data(), DType::i32, Device{}, {kRows}, {2});
  ASSERT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale));
  for (int32_t slot : {0, 4, 7, 11}) EXPECT_EQ(pool_bytes[slot * 512 + 100], std::byte{0x3c});
  for (int32_t slot : {1, 2, 3, 5, 6, 8, 9, 10})
    EXPECT_EQ(pool_bytes[slot * 512 + 100], std::byte{0xab}) << slot;
}

// The pool must not share bytes with the rows or slots it is written from: the result would
// depend on the order of the writes.
TEST_F(QuantizeValidation, PoolOverlapsItsInputs) {
  const TensorView valid_rows = rows;
  rows = make_view(pool_bytes.data() + 512, DType::bf16, Device{}, {kRows, 512});
  expect_error(ErrorKind::value, "pool", "memory apart from rows", "an overlap with rows");
  rows = valid_rows;
  slots = make_view(pool_bytes.data() + 4 * 512, DType::i32, Device{}, {kRows});
  expect_error(ErrorKind::value, "pool", "memory apart from slots", "an overlap with slots");
}

// An fp8_ds_mla page's records and scale records fill its first block_size * 584 bytes
// whatever the view's token stride says: with a token stride past 584 B, bytes between the
// view's rows are still written. Slots there (byte 600 of page 0, inside slot 1's record)
// would be overwritten by the call that reads them.
TEST_F(QuantizeValidation, DsMlaPoolOverlapsItsInputsBetweenTokenStrides) {
  pool = make_view(scratch.data(), DType::u8, Device{}, {2, 2, 584}, {125 * 576, 1000, 1});
  rows = make_view(row_bytes.data(), DType::bf16, Device{}, {2, 512});
  auto* slot_bytes = reinterpret_cast<int32_t*>(scratch.data() + 600);
  slot_bytes[0] = 0;
  slot_bytes[250] = 1;
  slots = make_view(slot_bytes, DType::i32, Device{}, {2}, {250});
  const std::vector<std::byte> before = scratch;
  test::expect_smla_error([&] { quantize_kv(rows, slots, pool, kv_scale); }, ErrorKind::value,
                          "pool", "memory apart from slots", "an overlap with slots");
  EXPECT_TRUE(scratch == before) << "the pool was written before the error";
  // Past the page's 2 * 584 bytes, between the view's rows, they are apart.
  slots = make_view(scratch.data() + 1600, DType::i32, Device{}, {2}, {500});
  EXPECT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale));
}

TEST_F(QuantizeValidation, PoolAbsent) {
  pool = TensorView{};
  expect_error(ErrorKind::value, "pool", "KV pool", "absent");
}

TEST_F(QuantizeValidation, PoolWrongDtype) {
  pool = view(DType::f32, {kBlocks, kBlockSize, 512});
  expect_error(ErrorKind::type, "pool", "bf16, f8e4m3 or u8", "f32");
}

TEST_F(QuantizeValidation, PoolWrongShape) {
  pool = view(DType::u8, {kBlocks, kBlockSize, 576});
  expect_error(ErrorKind::value, "pool", "584", "[3, 4, 576]");
}

TEST_F(QuantizeValidation, DsMlaPageStrideNotAMultipleOf576) {
  pool = make_view(scratch.data(), DType::u8, Device{}, {2, 4, 584}, {4 * 584, 584, 1});
  expect_error(ErrorKind::value, "pool", "multiple of 576 B", "2336 B");
}

TEST_F(QuantizeValidation, DsMlaTokenStrideBelowARecordAndItsScales) {
  // The view would end 8 B into its last page's last record: writing slot 7 would pass it.
  pool = make_view(scratch.data(), DType::u8, Device{}, {2, 4, 584}, {5 * 576, 576, 1});
  expect_error(ErrorKind::value, "pool", "token stride >= 584 B", "576 B");
}

TEST_F(QuantizeValidation, KvScaleNotFiniteOrNotPositive) {
  const std::pair<float, const char*> bad[] = {{std::numeric_limits<float>::quiet_NaN(), "nan"},
                                               {std::numeric_limits<float>::infinity(), "inf"},
                                               {-std::numeric_limits<float>::infinity(), "-inf"},
                                               {0.0f, "0"},
                                               {-0.0f, "-0"},
                                               {-0.5f, "-0.5"},
                                               {-1e-30f, "-1e-30"},
                                               {-std::ldexp(1.0f, -140), "-7.17465e-43"}};
  for (const auto& [value, text] : bad) {
    kv_scale = value;
    expect_error(ErrorKind::value, "kv_scale", "finite float > 0", text);
  }
}

// The finite floats > 0 at both ends are taken: the largest and the smallest subnormal.
TEST_F(QuantizeValidation, KvScaleEdgesAreTaken) {
  for (const float value :
       {std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
    kv_scale = value;
    EXPECT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale)) << value;
  }
}

// kv_scale is checked for every layout, also where it is not used.
TEST_F(QuantizeValidation, KvScaleCheckedForBf16Pools) {
  std::vector<std::byte> bf16_pool(kBlocks * kBlockSize * 1024);
  pool = make_view(bf16_pool.data(), DType::bf16, Device{}, {kBlocks, kBlockSize, 512});
  kv_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(ErrorKind::value, "kv_scale", "finite float > 0", "nan");
}

// A build without CUDA refuses every CUDA pool; a CUDA build one on a device it cannot use
// (here one that no machine has), before any memory is touched.
TEST_F(QuantizeValidation, PoolOnAnUnusableCudaDeviceIsUnsupported) {
  rows.device = slots.device = pool.device = Device{DeviceKind::cuda, 63};
#if SMLA_WITH_CUDA
  expect_error(ErrorKind::unsupported, "pool", "a Hopper GPU", "cuda:63");
#else
  expect_error(ErrorKind::unsupported, "pool", "a cpu pool", "cuda:63");
#endif
}

// No rows: slots must be [0] too (a size of 0 is no wildcard).
TEST_F(QuantizeValidation, SlotsForNoRowsAreEmpty) {
  rows = view(DType::bf16, {0, 512});
  expect_error(ErrorKind::value, "slots", "[N = 0]", "[5]");
}

// 2^27 padding rows as broadcast views: the slot check took storage for every row before it
// kept the written ones (2 GiB here; 32 GiB at 2^31) and threw std::bad_alloc. Under an
// address-space limit of 1 GiB past what the process has mapped the call writes nothing.
TEST_F(QuantizeValidation, BroadcastPaddingRowsTakeNoStorageARow) {
#if defined(SMLA_ASAN)
  GTEST_SKIP() << "AddressSanitizer maps more than an address-space limit leaves";
#endif
  const int64_t n = int64_t(1) << 27;
  int32_t padding = -1;
  rows = make_view(row_bytes.data(), DType::bf16, Device{}, {n, 512}, {0, 1});
  slots = make_view(&padding, DType::i32, Device{}, {n}, {0});
  const std::vector<std::byte> before = pool_bytes;
  const AddressSpaceCap cap(rlim_t{1} << 30);
  ASSERT_TRUE(cap.ok());
  ASSERT_NO_THROW(quantize_kv(rows, slots, pool, kv_scale));
  EXPECT_TRUE(pool_bytes == before) << "a padding row was written";
}

// A refused float is quoted with the nine digits that read back as itself.
TEST_F(QuantizeValidation, KvScaleQuotedToNineDigits) {
  uint32_t bits = 0xbdccccd0u;  // -0.100000024f: 8 digits read back as another float
  std::memcpy(&kv_scale, &bits, 4);
  expect_error(ErrorKind::value, "kv_scale", "finite float > 0", "-0.100000024");
}

}  // namespace
}  // namespace smla::test
