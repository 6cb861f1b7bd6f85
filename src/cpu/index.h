// The CPU index builders (SPEC §4): the reference rows, multithreaded over chunks of tokens.
#pragma once
#include "core/index_problem.h"

namespace smla::cpu {

// Writes args.out; throws smla::Error for a block-table page or top-k index out of range.
void build_sparse_indices(const IndexProblem& problem, const SparseIndexArgs& args);

}  // namespace smla::cpu
