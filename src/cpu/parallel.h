// Static-partition parallel loop over the CPU backend's worker threads.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace smla::cpu {

constexpr int kMaxThreads = 4096;

// Threads the CPU backend uses: SMLA_NUM_THREADS if set and not empty, else the CPUs this
// process may run on (its affinity mask), at most kMaxThreads; throws a value Error naming
// SMLA_NUM_THREADS for anything but 1..kMaxThreads.
int num_threads();

// Calls fn(i) for i in [0, n), split in contiguous ranges over up to num_threads() threads, the
// caller's among them. The exception of the lowest i that threw is rethrown on the caller's
// thread (each range stops at its first), so errors name the first bad index whatever the
// thread count. Ranges whose thread the system refuses run on the caller's thread.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int64_t workers = std::min<int64_t>(num_threads(), n);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  const auto range = [&](int64_t w) {
    try {
      for (int64_t i = n * w / workers; i < n * (w + 1) / workers; ++i) fn(i);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  int64_t started = 1;  // range 0 is the caller's
  try {
    for (; started < workers; ++started) threads.emplace_back(range, started);
  } catch (...) {  // no more threads to be had (std::system_error, std::bad_alloc)
  }
  range(0);
  for (int64_t w = started; w < workers; ++w) range(w);
  for (auto& t : threads) t.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace smla::cpu
