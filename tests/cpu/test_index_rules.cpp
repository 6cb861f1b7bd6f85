// The shared per-token rules: the CUDA builder's parallel request count (requests_started,
// summed over its threads) against the binary search the CPU builder uses.
#include <gtest/gtest.h>

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
  SCOPED_TRACE("SMLA_TEST_SEED=" + std::to_string(seed));
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
  SCOPED_TRACE("SMLA_TEST_SEED=" + std::to_string(seed));
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

}  // namespace
}  // namespace smla::test
