// The CPU backend's thread count and parallel loop.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/sanitizers.h"
#include "cpu/parallel.h"
#include "smla/error.h"
#include "threads_env.h"

namespace smla::cpu {
namespace {

using test::ThreadsEnv;

TEST(Parallel, NumThreadsFromEnvironment) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const int fallback = std::min(CPU_COUNT(&allowed), kMaxThreads);
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

// Unset, the count is the CPUs the process may run on, not the machine's: a child process
// pinned to one random CPU of its mask gets one thread.
TEST(Parallel, DefaultIsTheCpusOfTheAffinityMask) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  const int cpu = cpus[std::random_device{}() % cpus.size()];
  EXPECT_EXIT(
      {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) std::_Exit(2);
        unsetenv("SMLA_NUM_THREADS");
        std::_Exit(num_threads() == 1 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "")
      << "pinned to CPU " << cpu << " of " << cpus.size();
}

TEST(Parallel, EachIndexOnce) {
  ThreadsEnv env("4");
  for (int64_t n : {0, 1, 3, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, [&](int64_t i) { hits[i]++; });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i << " of " << n;
  }
}

// min(threads, n) ranges, none empty, that tile [0, n) and differ in size by at most one.
TEST(Parallel, RangesTileTheIndicesEvenly) {
  ThreadsEnv env("4");
  for (int64_t n : {0, 1, 3, 6, 1001}) {
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    parallel_ranges(n, [&](int64_t begin, int64_t end) {
      const std::lock_guard<std::mutex> lock(mutex);
      ranges.emplace_back(begin, end);
    });
    std::sort(ranges.begin(), ranges.end());
    ASSERT_EQ(int64_t(ranges.size()), std::min<int64_t>(n, 4)) << n;
    int64_t next = 0;
    for (const auto& [begin, end] : ranges) {
      EXPECT_EQ(begin, next) << n;
      EXPECT_GE(end - begin, n / 4) << n;
      EXPECT_LE(end - begin, (n + 3) / 4) << n;
      next = end;
    }
    EXPECT_EQ(next, n);
  }
}

TEST(Parallel, RangesWhoseThreadCannotStartRunOnTheCaller) {
#if defined(SMLA_ASAN) || defined(SMLA_TSAN)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit the 512 MiB address space";
#endif
  // A child process whose address space holds a few dozen thread stacks asks for 4096 threads:
  // the ranges left run on the caller (fewer distinct threads than ranges), every index once.
  EXPECT_EXIT(
      {
        rlimit limit{};
        getrlimit(RLIMIT_AS, &limit);
        limit.rlim_cur = rlim_t(512) << 20;
        setrlimit(RLIMIT_AS, &limit);
        setenv("SMLA_NUM_THREADS", "4096", 1);
        std::vector<std::atomic<int>> hits(100000);
        std::mutex mutex;
        std::set<std::thread::id> threads;
        parallel_for(int64_t(hits.size()), [&](int64_t i) {
          hits[i]++;
          const std::lock_guard<std::mutex> lock(mutex);
          threads.insert(std::this_thread::get_id());
        });
        for (const std::atomic<int>& h : hits)
          if (h.load() != 1) std::_Exit(1);
        std::_Exit(threads.size() < 4096 ? 0 : 2);
      },
      testing::ExitedWithCode(0), "");
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
