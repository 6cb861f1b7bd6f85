// POD parameters of the decode kernel, filled on the host from a validated DecodeProblem.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "core/fast_div.h"

namespace smla::cuda {

// Row geometry of one KV pool (see core/problem.h KvPool); 32-bit where offsets are int32.
struct PoolParams {
  const char* base;
  int64_t token_stride_bytes;
  int64_t block_stride_bytes;
  uint32_t rows;        // num_blocks * span, clamped to 2^31
  FastDiv span;
  uint32_t block_size;
  uint32_t scales_offset_bytes;  // fp8_ds_mla: where a page's scale records start
};

// TopkColumns: compressed columns translated from a top-k in the kernel (indices null: none).
struct TopkParams {
  const int32_t* indices;      // [T, top_k]
  int64_t stride;
  int top_k;
  const int32_t* block_table;  // [>= B, pages]
  int64_t table_stride;
  int pages;
  const uint8_t* is_valid;     // [T] or null
  int64_t valid_stride;
  int num_decodes, compress_ratio;
};

struct DecodeParams {
  const void* query;                 // [T, H, 512] bf16, or e4m3 in the f16 kernels
  int64_t q_token_stride, q_head_stride;  // elements
  PoolParams swa, compressed;
  const int32_t* sparse_indices;     // [T, K]
  int64_t indices_stride;
  const int32_t* sparse_topk_lens;   // [T]; unused with topk
  TopkParams topk;
  const int32_t* seq_lens;           // [B]
  const int32_t* cum_seq_lens_q;     // [B+1] or null: one token per request
  const float* sinks;                // [H] or null
  void* out;                         // [T, H_out, 512] bf16
  int64_t out_token_stride, out_head_stride;
  float* lse;                        // [T, H] or null, heads contiguous (validated)
  int64_t lse_token_stride;
  float scale_log2;                  // bmm1_scale * log2(e)
  float bmm2_scale;
  int num_requests, num_heads, out_heads, num_columns, window;
  // Work decomposition: CTA = (token, head block, split), splits fastest (a cluster's CTAs).
  int heads_per_cta, head_blocks, num_splits, tiles_per_split;
  bool cluster;                      // split rows reduced in their cluster, else as below
  float* partials;                   // split-KV partial outputs and (m, l), see decode_plan.h
  int32_t* counters;                 // one per (token, head block), zero between launches
};

// The kernels that read the query by TMA take its tensor map too (boxes of 8 heads x 128 bytes);
// the others keep DecodeParams as it is, so their code does not move.
struct QueryTmaParams : DecodeParams {
  CUtensorMap q_map;
  bool query_evict_first;  // the query's lines go first from L2 where the rows' do (query_by_tma)
  int wave_ctas;  // CTAs that run at once (one an SM): CTA i + wave_ctas follows CTA i's wave
};
template <bool kQueryTma>
using KernelParams = std::conditional_t<kQueryTma, QueryTmaParams, DecodeParams>;

}  // namespace smla::cuda
