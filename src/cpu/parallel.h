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

// Calls fn(begin, end) once for each of up to num_threads() contiguous ranges that split
// [0, n) evenly, each range on a thread of its own, the caller's among them. The exception of
// the lowest range that threw is rethrown on the caller's thread, so that, with an fn that
// stops at its range's first error, errors name the first bad index whatever the thread count.
// Ranges whose thread the system refuses run on the caller's thread.
template <class Fn>
void parallel_ranges(int64_t n, Fn&& fn) {
  const int64_t workers = std::min<int64_t>(num_threads(), n);
  if (workers <= 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  const auto range = [&](int64_t w) {
    try {
      fn(n * w / workers, n * (w + 1) / workers);
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

// Calls fn(i) for i in [0, n) over parallel_ranges: the exception of the lowest i that threw
// is rethrown on the caller's thread (each range stops at its first).
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

}  // namespace smla::cpu
