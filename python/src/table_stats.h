// TableStats as a Python dict, for SparseIndexTables and StepExecutor alike.
#pragma once
#include "smla/tables.h"
#include "tensor_arg.h"

namespace smla::py {

// {"builds": {(group, key): n}, "forks": [(group, key)], "waits": [layer],
//  "peak_tables": {group: n}, "bytes": n, "peak_bytes": n}
nb::dict stats_dict(const TableStats& stats);

}  // namespace smla::py
