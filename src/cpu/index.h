// The CPU index builders (SPEC §4): the reference rows, multithreaded over chunks of tokens.
#pragma once
#include "core/index_problem.h"

namespace smla::cpu {

// Writes args.out; throws smla::Error for a block-table page or top-k index out of range.
void build_sparse_indices(const IndexProblem& problem, const SparseIndexArgs& args);

// SPEC §4: the storage offset of top-k entry x = topk[t][j] of request b in `pool`, through
// `block_table` (a negative entry stays). An entry whose page the table lacks throws naming
// `topk_name`, and `table_name` in what was expected. Shared by the builder and the decode.
int32_t topk_entry_offset(int64_t x, int64_t t, int64_t j, int64_t b, const TensorView& block_table,
                          const KvPool& pool, const char* topk_name, const char* table_name);

// SPEC §4: a decode token's top-k is -1 padded with its valid entries first, so that its
// length, count(x >= 0), covers them all. Returns that count of topk[t][0, top_k); an entry
// x >= 0 after a negative one throws naming `topk_name`. Shared by the builder and the decode.
int64_t decode_topk_count(const TensorView& topk, int64_t t, int64_t top_k, const char* topk_name);

}  // namespace smla::cpu
