// The shared per-token rules: the CUDA builder's parallel request count (requests_started,
// summed over its threads) against the binary search the CPU builder uses; storage offsets at
// the int32 edge and negative top-k entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "case_gen.h"
#include "core/index_rules.h"

namespace smla::test {
namespace {

// A thread count of `step`: the sum of every thread's count.
int64_t counted_request(int64_t t, int64_t step, const std::vector<int64_t>& starts) {
  const int64_t num_requests = static_cast<int64_t>(starts.size()) - 1;
  auto start = [&](int64_t b) { return starts[b]; };
  int64_t sum = 0;
  for (int64_t first = 1; first <= step; ++first)
    sum += rules::requests_started(t, first, step, num_requests, start);
  return sum;
}

TEST(IndexRules, RequestCountEqualsTheSearch) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  Rng rng(seed);
  for (int round = 0; round < 200; ++round) {
    const int64_t num_requests = rng.uniform(1, 1500);
    std::vector<int64_t> starts(num_requests + 1, 0);  // nondecreasing, empty requests too
    for (int64_t b = 1; b <= num_requests; ++b) starts[b] = starts[b - 1] + rng.uniform(0, 4);
    auto start = [&](int64_t b) { return starts[b]; };
    const int64_t step = rng.chance(0.5) ? 512 : rng.uniform(1, 700);
    for (int64_t t = 0; t < starts.back(); t += rng.uniform(1, 5))
      ASSERT_EQ(counted_request(t, step, starts), rules::request_of(t, num_requests, start))
          << "t " << t << ", " << num_requests << " requests, step " << step;
  }
}

// Whatever the starts (device data is not trusted), the count is a request: in [0, B).
TEST(IndexRules, RequestCountOfBadStartsStaysARequest) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  Rng rng(seed);
  for (int round = 0; round < 200; ++round) {
    const int64_t num_requests = rng.uniform(1, 900);
    std::vector<int64_t> starts(num_requests + 1);
    for (auto& s : starts) s = rng.uniform(-50, 50);
    const int64_t t = rng.uniform(-10, 60), got = counted_request(t, 512, starts);
    ASSERT_GE(got, 0);
    ASSERT_LT(got, num_requests);
  }
}

// An offset past int32 is padding, never the int32 it would wrap to (which may look like a
// real row), whichever rule makes it: past INT32_MAX it is -1 (a slot's, a page's or a top-k
// entry's); a negative page's slot below INT32_MIN stays negative, INT32_MIN (INT32_MIN * 64 + 5
// would wrap to 5). Pages drawn at the last one whose rows int32 reaches, or anywhere.
TEST(IndexRules, OffsetsPastInt32ArePadding) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  Rng rng(seed);
  int within = 0, past = 0, below = 0;
  for (int round = 0; round < 4000; ++round) {
    const int64_t block_size = rng.uniform(1, 512);
    const int64_t span = block_size + (rng.chance(0.5) ? rng.uniform(1, 64) : 0);
    const bool negative = rng.chance(0.5);  // an evicted page, or any negative id
    const int64_t least = negative ? INT32_MIN : 0, most = negative ? -1 : INT32_MAX;
    const int64_t edge = negative ? INT32_MIN / block_size : INT32_MAX / span;
    const int64_t page = rng.chance(0.5)
                             ? rng.uniform(std::max(edge - 2, least), std::min(edge + 2, most))
                             : rng.uniform(least, most);
    const int64_t in_page = rng.uniform(0, block_size - 1);
    const int64_t pos = in_page + block_size * rng.uniform(0, 1000);  // an int32 entry too
    const int64_t offset = page * (negative ? block_size : span) + in_page;
    const int32_t want = offset > INT32_MAX   ? -1
                         : offset < INT32_MIN ? INT32_MIN
                                              : static_cast<int32_t>(offset);
    ++(offset > INT32_MAX ? past : offset < INT32_MIN ? below : within);
    const int32_t id = static_cast<int32_t>(page);
    SCOPED_TRACE("page " + std::to_string(page) + ", block_size " + std::to_string(block_size) +
                 ", span " + std::to_string(span) + ", pos " + std::to_string(pos));
    ASSERT_EQ(rules::storage_offset(rules::slot(id, block_size, pos), block_size, span), want);
    ASSERT_EQ(rules::page_offset(id, in_page, block_size, span), want);
    if (!negative)  // (a negative top-k entry is copied: below)
      ASSERT_EQ(rules::topk_offset(static_cast<int32_t>(pos), id, block_size, span), want);
  }
  EXPECT_GT(within, 0);
  EXPECT_GT(past, 0);
  EXPECT_GT(below, 0);
}

// A negative top-k entry is copied as it is, whatever its page (-1 padding or another value).
TEST(IndexRules, NegativeTopkEntryIsCopied) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  Rng rng(seed);
  for (int round = 0; round < 200; ++round) {
    const int32_t x =
        static_cast<int32_t>(rng.chance(0.5) ? rng.uniform(INT32_MIN, -2) : rng.uniform(-100, -2));
    const int32_t page = static_cast<int32_t>(rng.uniform(-1, INT32_MAX));
    const int64_t E = rng.uniform(1, 512), span = E + rng.uniform(0, 64);
    ASSERT_EQ(rules::topk_offset(x, page, E, span), x)
        << "page " << page << ", E " << E << ", span " << span;
  }
}

}  // namespace
}  // namespace smla::test
