// Static-partition parallel loop over the CPU backend's worker threads.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace smla::cpu {

// Threads the CPU backend uses: SMLA_NUM_THREADS if set, else the hardware concurrency.
int num_threads();

// Calls fn(i) for i in [0, n), split in contiguous ranges over up to num_threads() threads.
// The first exception thrown by any fn is rethrown on the caller's thread.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int64_t workers = std::min<int64_t>(num_threads(), n);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        for (int64_t i = n * w / workers; i < n * (w + 1) / workers; ++i) fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace smla::cpu
