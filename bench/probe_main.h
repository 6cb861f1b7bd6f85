// The probes' entry point: they take no arguments (--help prints what one measures), and an
// error (no GPU, a failed launch) is printed with exit 1 instead of escaping main.
#pragma once
#include <cstdio>
#include <cstring>
#include <exception>

namespace smla::bench {

// `run` returns the exit status (1 where a probe's bytes did not match); `what` is its summary.
inline int probe_main(int argc, char** argv, const char* what, int (*run)()) {
  const char* slash = std::strrchr(argv[0], '/');
  const char* name = slash ? slash + 1 : argv[0];
  if (argc > 1) {
    const bool help = argc == 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"));
    if (!help) std::fprintf(stderr, "%s: unknown argument %s\n", name, argv[1]);
    std::fprintf(help ? stdout : stderr, "usage: %s (no arguments)\n%s\n", name, what);
    return help ? 0 : 2;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace smla::bench
