#include "cpu/parallel.h"

#include <cstdlib>

namespace smla::cpu {

// Read on every call (not cached) so that a process can change it between calls, e.g. the
// tests comparing one thread against several.
int num_threads() {
  if (const char* env = std::getenv("SMLA_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace smla::cpu
