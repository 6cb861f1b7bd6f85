// TensorView and its helpers (smla/tensor.h): the strides make_view derives, what it refuses,
// the element counts and contiguity validation relies on, and the names errors print.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "error_check.h"
#include "smla/error.h"
#include "smla/tensor.h"

namespace smla {
namespace {

TEST(TensorView, RowMajorStridesAndNegativeDims) {
  const TensorView v = make_view(nullptr, DType::bf16, Device{}, {3, 5, 7});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.strides[0], 35);
  EXPECT_EQ(v.strides[1], 7);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.size(-1), 7);
  EXPECT_EQ(v.stride(-2), 7);
  EXPECT_EQ(v.numel(), 105);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_TRUE(v.defined());
  EXPECT_EQ(make_view(nullptr, DType::bf16, Device{}, {2, 3, 5, 7}).numel(), 210);  // all 4 dims
  EXPECT_FALSE(TensorView{}.defined());
  EXPECT_EQ(TensorView{}.numel(), 0);  // absent: no elements, though the empty product is 1
}

// Size-1 dims may take any stride (a broadcast or a slice of one); any other gap is not
// contiguous, nor are reversed strides.
TEST(TensorView, ContiguityIgnoresSizeOneDims) {
  EXPECT_TRUE(make_view(nullptr, DType::f32, Device{}, {4, 1, 8}, {8, 1000, 1}).is_contiguous());
  EXPECT_FALSE(make_view(nullptr, DType::f32, Device{}, {4, 8}, {16, 1}).is_contiguous());
  EXPECT_FALSE(make_view(nullptr, DType::f32, Device{}, {4, 8}, {8, 2}).is_contiguous());
  EXPECT_FALSE(make_view(nullptr, DType::f32, Device{}, {2, 2}, {1, 2}).is_contiguous());
  // The 4th dim counts: contiguous dims 0..2 over a last dim of stride 2.
  EXPECT_FALSE(
      make_view(nullptr, DType::f32, Device{}, {2, 3, 5, 7}, {15, 5, 1, 2}).is_contiguous());
  EXPECT_EQ(make_view(nullptr, DType::f32, Device{}, {4, 0}).numel(), 0);
}

// Shapes past int64 strides, ranks outside 1..4 and a stride list of another length are
// refused by name, not wrapped or read past the arrays.
TEST(TensorView, RefusesWhatCannotBeAView) {
  const int64_t big = int64_t(1) << 40;
  test::expect_smla_error([&] { make_view(nullptr, DType::u8, Device{}, {2, big, big, 16}); },
                          ErrorKind::value, "shape", "sizes whose row-major strides fit in int64",
                          "u8[2, 1099511627776, 1099511627776, 16] cpu");
  EXPECT_EQ(make_view(nullptr, DType::u8, Device{}, {big, big}).strides[0], big);
  test::expect_smla_error([] { make_view(nullptr, DType::u8, Device{}, {}); }, ErrorKind::value,
                          "shape", "1..4 dims", "0 dims");
  test::expect_smla_error([] { make_view(nullptr, DType::u8, Device{}, {1, 2, 3, 4, 5}); },
                          ErrorKind::value, "shape", "1..4 dims", "5 dims");
  test::expect_smla_error([] { make_view(nullptr, DType::u8, Device{}, {2, 3}, {3}); },
                          ErrorKind::value, "strides", "2 strides", "1");
  TensorView wide = make_view(nullptr, DType::i32, Device{}, {2, 3, 1, 4});
  wide.ndim = 9;  // a caller's field: numel and describe stay inside the arrays (all 4 of them)
  EXPECT_EQ(wide.numel(), 24);
  EXPECT_EQ(describe(wide), "i32 of 9 dims cpu");
}

TEST(TensorView, NamesSizesAndDevices) {
  const std::pair<DType, size_t> sizes[] = {
      {DType::bf16, 2}, {DType::f8e4m3, 1}, {DType::f32, 4}, {DType::i32, 4}, {DType::u8, 1}};
  for (const auto& [dtype, bytes] : sizes) EXPECT_EQ(dtype_size(dtype), bytes) << dtype_name(dtype);
  EXPECT_EQ(describe(make_view(nullptr, DType::f8e4m3, Device{DeviceKind::cuda, 3}, {4, 64})),
            "f8e4m3[4, 64] cuda:3");
  EXPECT_EQ(describe(TensorView{}), "absent");
  EXPECT_EQ(device_name(Device{}), "cpu");
  // Every CPU id is the one host; GPUs differ by ordinal.
  EXPECT_EQ((Device{DeviceKind::cpu, 0}), (Device{DeviceKind::cpu, 7}));
  EXPECT_FALSE((Device{DeviceKind::cuda, 0}) == (Device{DeviceKind::cuda, 1}));
  EXPECT_FALSE((Device{DeviceKind::cuda, 0}) == (Device{DeviceKind::cpu, 0}));
}

// make_view's default strides are contiguous, a size-1 dim's too.
TEST(TensorView, SizeOneDimsGetContiguousStrides) {
  EXPECT_EQ(make_view(nullptr, DType::u8, Device{}, {1, 4}).strides[0], 4);
}

}  // namespace
}  // namespace smla
