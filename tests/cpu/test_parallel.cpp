// The CPU backend's thread count and parallel loop.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/parallel.h"
#include "smla/error.h"

namespace smla::cpu {
namespace {

// Sets SMLA_NUM_THREADS for one scope and restores it after.
class ThreadsEnv {
 public:
  explicit ThreadsEnv(const char* value) {
    if (const char* old = std::getenv("SMLA_NUM_THREADS")) saved_ = old, had_ = true;
    setenv("SMLA_NUM_THREADS", value, 1);
  }
  ~ThreadsEnv() {
    had_ ? setenv("SMLA_NUM_THREADS", saved_.c_str(), 1) : unsetenv("SMLA_NUM_THREADS");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(Parallel, NumThreadsFromEnvironment) {
  const int fallback = std::max(1u, std::thread::hardware_concurrency());
  {
    ThreadsEnv env("3");
    EXPECT_EQ(num_threads(), 3);
  }
  {
    ThreadsEnv env("");  // set but empty: as if unset
    EXPECT_EQ(num_threads(), fallback);
  }
  for (const char* bad : {"0", "-2", "abc", "4x", " 4", "4097", "99999999999"}) {
    ThreadsEnv env(bad);
    try {
      num_threads();
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::value);
      EXPECT_EQ(e.argument(), "SMLA_NUM_THREADS");
      EXPECT_EQ(e.got(), "'" + std::string(bad) + "'");
    }
  }
}

TEST(Parallel, EachIndexOnce) {
  ThreadsEnv env("4");
  for (int64_t n : {0, 1, 3, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, [&](int64_t i) { hits[i]++; });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i << " of " << n;
  }
}

TEST(Parallel, RethrowsOnTheCaller) {
  ThreadsEnv env("4");
  EXPECT_THROW(parallel_for(100,
                            [](int64_t i) {
                              if (i == 77) throw std::runtime_error("x");
                            }),
               std::runtime_error);
}

// With several failing indices the lowest one's error comes back, whichever thread ends first.
TEST(Parallel, RethrowsTheLowestIndexError) {
  ThreadsEnv env("4");
  for (int trial = 0; trial < 50; ++trial) {
    try {
      parallel_for(100, [](int64_t i) {
        if (i == 10 || i == 60 || i == 90) throw std::runtime_error(std::to_string(i));
      });
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      ASSERT_STREQ(e.what(), "10") << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace smla::cpu
