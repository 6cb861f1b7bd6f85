// How much host memory `smla run` may take: the machine's, capped by the memory limits of the
// process's own cgroup and of each cgroup above it (v2 memory.max, v1 memory.limit_in_bytes).
#pragma once
#include <filesystem>
#include <string_view>

namespace smla::cli {

// The lowest limit on the cgroup paths that `self_cgroup` (the text of /proc/self/cgroup) names
// under `root` (/sys/fs/cgroup), the path's ancestors included; +infinity where none is set.
double cgroup_memory_limit(std::string_view self_cgroup, const std::filesystem::path& root);

// Two thirds of the machine's memory or of this process's cgroup limit, whichever is lower
// (of 24 GiB where the machine's cannot be asked).
double host_limit_bytes();

}  // namespace smla::cli
