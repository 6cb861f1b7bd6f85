// The CUDA index builders (SPEC §4): one kernel launch per table on `stream`, no allocation, no
// host synchronisation, capturable. Rows match the CPU builder's bit for bit; where the CPU
// throws on a block-table page or top-k index out of range, the column is -1.
#pragma once
#include "core/index_problem.h"

namespace smla::cuda {

void build_sparse_indices(const IndexProblem& problem, const SparseIndexArgs& args, void* stream);

// The kernel's host entry, for tests that count its nodes in a captured graph.
const void* index_kernel();

}  // namespace smla::cuda
