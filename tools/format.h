// printf-style formatting into a std::string, for the tools' and benchmarks' tables and CSV.
#pragma once
#include <cstdio>
#include <string>

namespace smla::cli {

// `pattern` filled with `args`, cut at 511 characters (a table row or CSV field).
template <class... Args>
std::string format(const char* pattern, Args... args) {
  char line[512];
  std::snprintf(line, sizeof line, pattern, args...);
  return line;
}

// `value` by `pattern`, or `none` where it was not measured (0).
inline std::string measured(double value, const char* pattern, const char* none) {
  return value > 0 ? format(pattern, value) : none;
}

}  // namespace smla::cli
