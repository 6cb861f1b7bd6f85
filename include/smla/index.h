// Sparse-index table builders (SPEC §4): the per-token rows of storage offsets and lengths
// that sparse_mla_decode reads, for decode, prefill and mixed batches and the DSpark window.
#pragma once
#include <cstdint>

#include "smla/decode.h"
#include "smla/tensor.h"

namespace smla {

// The requests of one step: the same for every layer and SWA group.
struct StepMetadata {
  int64_t num_tokens = 0;       // T (may include CUDA-graph padding tokens)
  TensorView seq_lens{};        // [B] i32: KV length of each request, including its new tokens
  TensorView cum_seq_lens_q{};  // [B+1] i32, cum[B] == T; absent: one token per request (B == T)
  TensorView is_valid_token{};  // [T] u8, optional (absent: all valid); 0 = padding token
  int64_t num_decodes = 0;      // requests [0, num_decodes) are decode requests, the rest prefill
  int max_q_len = 1;            // >= every q_len (>= 1); what the decode op is told, checked
                                // by the builders as by the decode (q_lens: host values only;
                                // device ones: num_tokens <= B x max_q_len, builders only)
  int decode_swa_width = 0;     // > window: DSpark non-causal window (dspark_swa_width); 0..window:
                                // causal; negative: refused
};

// One SWA KV-cache group: its pages, and the pool whose block_size and span they address.
struct SwaGroup {
  TensorView block_table{};   // [>= B, pages] i32
  TensorView swa_kv_cache{};  // a KV pool (decode.h): its geometry, and its address (aligned,
                              // apart from `out`); no element is read
};

// The compressed columns of a layer; ignored when compress_ratio == 0 (SWA-only layer).
struct CompressedColumns {
  int compress_ratio = 0;
  // [T, top_k] i32: the index source's local top-k, -1 padded (decode rows: valid ones first)
  TensorView topk_indices{};
  TensorView block_table{};          // [>= B, pages] i32 of the compressed cache
  TensorView compressed_kv_cache{};  // E = its block_size (compressed entries per page), its span
};

// A built table: what a layer passes to sparse_mla_decode.
struct SparseIndexTable {
  TensorView sparse_indices{};    // [T, K] i32 storage offsets, -1 = padding
  TensorView sparse_topk_lens{};  // [T] i32
  TensorView seq_lens{};          // DSpark only: [T] i32, one request per token; else absent
};

struct SparseIndexArgs {
  StepMetadata step{};
  SwaGroup swa{};
  CompressedColumns compressed{};
  int window = kWindow;    // W
  SparseIndexTable out{};  // written
};

// K of a table: W + round_up(top_k, 4) (top_k = 0 for SWA-only layers), or the DSpark width
// (decode_swa_width > W: a multiple of 4, top_k 0); a value error for window < 1, top_k outside
// 0..2^31 - 1, a negative decode_swa_width or a DSpark width the builder refuses.
int64_t sparse_index_columns(int window, int64_t top_k, int decode_swa_width);
// K of the table `args` describe (top_k from its topk_indices); a value error naming
// topk_indices where that width passes 2^31 - 1, or compress_ratio below 0 or above 0 with a
// DSpark width.
int64_t sparse_index_columns(const SparseIndexArgs& args);

// DSpark's SWA row width for k draft tokens: round_up(W + k, 64).
int dspark_swa_width(int window, int num_draft_tokens);

// Fills `out` (caller-allocated, shapes from sparse_index_columns) on the device of its tensors
// (on CUDA the current device), on `stream` for device backends (CUDA: one kernel launch,
// capturable). Throws smla::Error naming the first bad argument; values are checked for host
// tensors only (a device cannot read them without a synchronisation): on CUDA, a column whose
// block-table page or top-k index is out of range is -1, and a decode row's valid top-k entry
// after a negative one lies past the row's length (its entries >= 0 counted), where the CPU
// throws, possibly after other rows were written: `out` is undefined after an Error.
void build_sparse_indices(const SparseIndexArgs& args, void* stream = nullptr);

}  // namespace smla
