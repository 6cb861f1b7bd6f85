// A command's exit status once its standard output is written out: a report, table or usage
// that could not be written (a full disk, a closed descriptor) exits 1, saying so on stderr, so
// that a script reading only the exit code does not see success. `smla` and the benchmarks
// return it from main.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace smla::cli {

// `status`, or 1 (with "<program>: writing the output: <why>" on stderr) where a write to
// stdout failed, at the final flush or before it.
inline int stdout_status(const char* program, int status) {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  if (!flush_failed && !std::ferror(stdout)) return status;
  // A flush names its error; an earlier write's errno may have moved on since.
  std::fprintf(stderr, "%s: writing the output: %s\n", program,
               flush_failed ? std::strerror(errno) : "a write to it failed");
  return 1;
}

}  // namespace smla::cli
