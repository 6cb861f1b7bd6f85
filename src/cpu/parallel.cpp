#include "cpu/parallel.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "smla/error.h"

namespace smla::cpu {

// Read on every call (not cached) so that a process can change it between calls, e.g. the
// tests comparing one thread against several. A value that is not a thread count is an error,
// not the default: a typo would otherwise run on every thread unnoticed.
int num_threads() {
  const char* env = std::getenv("SMLA_NUM_THREADS");
  if (env == nullptr || *env == '\0') return std::max(1, int(std::thread::hardware_concurrency()));
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
