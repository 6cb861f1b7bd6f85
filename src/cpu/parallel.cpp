#include "cpu/parallel.h"

#include <sched.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "smla/error.h"

namespace smla::cpu {

// The CPUs this process may run on (taskset, a container's cpuset), up to kMaxThreads.
// hardware_concurrency counts every CPU of the machine: a job given 2 of 128 CPUs would start
// 127 threads a call to time-slice on its 2.
static int available_cpus() {
  cpu_set_t set;
  const int count = sched_getaffinity(0, sizeof set, &set) == 0
                        ? CPU_COUNT(&set)
                        : int(std::thread::hardware_concurrency());  // past CPU_SETSIZE CPUs
  return std::clamp(count, 1, kMaxThreads);
}

// Read on every call (not cached) so that a process can change it between calls, e.g. the
// tests comparing one thread against several. A value that is not a thread count is an error,
// not the default: a typo would otherwise run on every thread unnoticed.
int num_threads() {
  const char* env = std::getenv("SMLA_NUM_THREADS");
  if (env == nullptr || *env == '\0') return available_cpus();
  int n = 0;
  const char* end = env + std::strlen(env);
  const auto [last, ec] = std::from_chars(env, end, n);
  if (ec != std::errc() || last != end || n < 1 || n > kMaxThreads)
    throw Error(ErrorKind::value, "SMLA_NUM_THREADS",
                "unset, empty or an integer in [1, " + std::to_string(kMaxThreads) + "]",
                "'" + std::string(env) + "'");
  return n;
}

}  // namespace smla::cpu
