// A validated index build (SPEC §4): sizes and pool geometry read once, shared by the backends.
#pragma once
#include <cstdint>

#include "core/problem.h"
#include "smla/index.h"

namespace smla {

struct IndexProblem {
  int64_t num_tokens = 0;    // T
  int64_t num_requests = 0;  // B
  int64_t num_decodes = 0;
  int64_t num_columns = 0;  // K
  int64_t top_k = 0;        // columns of topk_indices; 0 for SWA-only layers
  int window = kWindow;     // W
  int compress_ratio = 0;
  bool dspark = false;  // the non-causal DSpark window instead of the causal one
  KvPool swa;           // block_size and span of the SWA pages
  KvPool compressed;    // compressed layers: block_size = E, span
  Device device;
};

// Checks every argument (dtype, device, shape; values of cum_seq_lens_q and seq_lens when they
// are host tensors, else num_tokens <= B x max_q_len) and throws smla::Error naming the first
// bad one.
IndexProblem validate_index(const SparseIndexArgs& args);

// validate_index without the outputs, for a call on `device`: what a caller that allocates the
// outputs checks first, so that inputs the build would refuse never size an allocation.
void validate_index_inputs(const SparseIndexArgs& args, Device device);

}  // namespace smla
