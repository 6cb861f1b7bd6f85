#include "host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>

namespace smla::cli {
namespace {

// The lowest `file` in the cgroup `cgroup_path` under `root` and in each cgroup above it: a
// job's limit may be set on the cgroup it was placed in or on any above it.
double lowest_on_path(const std::filesystem::path& root, std::string_view cgroup_path,
                      const char* file) {
  double lowest = std::numeric_limits<double>::infinity();
  std::filesystem::path relative = std::filesystem::path(cgroup_path).relative_path();
  for (;;) {
    if (std::ifstream in(root / relative / file); in) {
      double limit = 0;  // "max" (no limit) reads as nothing
      if (in >> limit && limit > 0) lowest = std::min(lowest, limit);
    }
    if (relative.empty()) return lowest;
    relative = relative.parent_path();
  }
}

}  // namespace

double cgroup_memory_limit(std::string_view self_cgroup, const std::filesystem::path& root) {
  double lowest = std::numeric_limits<double>::infinity();
  std::istringstream lines{std::string(self_cgroup)};
  for (std::string line; std::getline(lines, line);) {
    // hierarchy-id:controllers:path; v2's unified line is "0::path"
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string_view controllers =
        std::string_view(line).substr(first + 1, second - first - 1);
    const std::string_view path = std::string_view(line).substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      lowest = std::min(lowest, lowest_on_path(root, path, "memory.max"));
      continue;
    }
    for (size_t begin = 0; begin <= controllers.size();) {
      const size_t end = std::min(controllers.find(',', begin), controllers.size());
      if (controllers.substr(begin, end - begin) == "memory") {
        lowest = std::min(lowest, lowest_on_path(root / "memory", path, "memory.limit_in_bytes"));
        break;
      }
      begin = end + 1;
    }
  }
  return lowest;
}

double host_limit_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page > 0 ? double(pages) * double(page) : 0x1.8p34;
  std::ifstream in("/proc/self/cgroup");
  const std::string self{std::istreambuf_iterator<char>(in), {}};
  bytes = std::min(bytes, cgroup_memory_limit(self, "/sys/fs/cgroup"));
  return bytes * 2 / 3;
}

}  // namespace smla::cli
