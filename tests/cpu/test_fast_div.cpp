// FastDiv (src/core/fast_div.h), which the CUDA producer divides pool offsets with, against
// the division operator over every divisor a pool may have up to 2^16 and some far past it.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_div.h"
#include "seed.h"

namespace smla {
namespace {

void expect_exact(uint32_t d, std::mt19937& rng) {
  const FastDiv f(d);
  std::vector<uint32_t> xs = {0, 1, d - 1, d, d + 1, 0x7fffffffu, 0x7fffffffu - d};
  for (uint32_t k : {1u, 2u, 3u, 1000u, 0x7fffffffu / d}) xs.insert(xs.end(), {k * d - 1, k * d});
  std::uniform_int_distribution<uint32_t> any(0, 0x7fffffffu);
  for (int i = 0; i < 64; ++i) xs.push_back(any(rng));
  for (uint32_t x : xs) {
    if (x > 0x7fffffffu) continue;
    ASSERT_EQ(f.div(x), x / d) << x << " / " << d;
  }
}

TEST(FastDiv, ExactBelow2To31) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(seed);
  for (uint32_t d = 1; d <= 65536; ++d) expect_exact(d, rng);
  std::uniform_int_distribution<uint32_t> large(65537, 0x7fffffffu);
  for (int i = 0; i < 4096; ++i) expect_exact(large(rng), rng);
  for (uint32_t d : {0x40000000u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) expect_exact(d, rng);
}

}  // namespace
}  // namespace smla
