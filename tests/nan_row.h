// A NaN in a row quantized into an fp8_ds_mla pool makes its 64-value group NaN (scale byte
// 255, every code 0x7F: docs/decode.md), which either device must carry to the output of every
// (token, head) attending the row, where a single 0x7F under a finite scale would read as a
// finite value on CUDA; the other tokens stay finite.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "oracle.h"

namespace smla::test {

// An fp8_ds_mla case without sinks (a +inf sink makes a head's output 0 whatever it attends)
// whose columns are all real rows and which has a token attending a row (make_attending_case:
// with a few tokens, every S(t) is empty about one seed in 2 x 10^4, and nothing would get the
// NaN), and the bf16 row with a NaN that goes to the slot of one of the first attending token's
// rows (fp8_ds_mla offsets are slots). Output heads past `heads` are padding, which stays zero.
// The output is poisoned with a finite value no output reaches (the NaN poison of make_case
// would pass for a NaN never written).
struct NanRowCase {
  static constexpr uint16_t kPoison = 0x4b4b;  // 1.3e7 in bf16; the pools' values are below 4e3

  DecodeCase c;
  HostTensor row = HostTensor::make(DType::bf16, {1, kHeadDim});
  HostTensor slots = HostTensor::make(DType::i32, {1});
  int64_t slot = -1;

  NanRowCase(uint64_t seed, int heads, int out_heads, int requests)
      : c(make_attending_case({.layout = KvLayout::fp8_ds_mla,
                               .heads = heads,
                               .out_heads = out_heads,
                               .requests = requests,
                               .max_q = 2,
                               .sinks = SinkKind::absent,
                               .pools = PoolSharing::absent,
                               .masked = 0},
                              seed)) {
    Rng rng(c.seed + 1);
    for (const std::vector<AttendedRow>& rows : attended_rows(c))  // a token may attend none
      if (!rows.empty()) {
        slot =
            rows[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(rows.size()) - 1))].offset;
        break;
      }
    slots.set<int32_t>(0, static_cast<int32_t>(slot));
    for (size_t i = 0; i < c.out.bytes.size() / 2; ++i) c.out.set<uint16_t>(int64_t(i), kPoison);
    for (int d = 0; d < kHeadDim; ++d) row.set<uint16_t>(d, to_bf16(rng.normal()));
    row.set<uint16_t>(rng.uniform(0, kNopeDim - 1), rng.chance(0.5) ? 0x7fc0 : 0xffc1);
  }
};

// After the row was quantized and the case decoded: every head's output row of a token that
// attends the NaN row holds a NaN or inf, every other token's outputs are finite, and the
// padding heads are zeros.
inline ::testing::AssertionResult nan_reaches_its_tokens_only(const NanRowCase& n) {
  const DecodeCase& c = n.c;
  const auto rows = attended_rows(c);
  const int heads = static_cast<int>(c.query.size(1));
  int64_t attending = 0;
  for (int64_t t = 0; t < c.out.size(0); ++t) {
    bool attends = false;
    for (const AttendedRow& a : rows[t]) attends = attends || a.offset == n.slot;
    attending += attends;
    for (int h = 0; h < c.out.size(1); ++h) {
      bool finite = true, zero = true, written = true;
      for (int d = 0; d < kHeadDim; ++d) {
        const uint16_t bits = c.out.get<uint16_t>(t * c.out.stride(0) + h * c.out.stride(1) + d);
        const double x = ref_bf16(bits);
        finite = finite && std::isfinite(x);
        zero = zero && x == 0;
        written = written && bits != NanRowCase::kPoison;
      }
      if (!written)
        return ::testing::AssertionFailure()
               << "token " << t << ", head " << h << ": output not written; " << c.summary;
      if (h >= heads && !zero)
        return ::testing::AssertionFailure()
               << "token " << t << ", padding head " << h << ": output not zero; " << c.summary;
      if (h < heads && finite == attends)
        return ::testing::AssertionFailure()
               << "token " << t << " (" << (attends ? "" : "not ") << "attending slot " << n.slot
               << "), head " << h << ": output " << (finite ? "finite" : "not finite") << "; "
               << c.summary;
    }
  }
  if (attending == 0) return ::testing::AssertionFailure() << "no token attends the NaN row";
  return ::testing::AssertionSuccess();
}

}  // namespace smla::test
