// TopkColumns in the decode kernel: the token's top-k entries counted (the row's length) and
// translated into storage offsets in shared memory, where the producer reads them.
#pragma once
#include "cuda/decode_layout.cuh"

namespace smla::cuda {

// TopkColumns. The producer warpgroup counts the token's top-k entries before the CTA's
// barrier (the row's length needs them all); the consumer warpgroups translate them into
// storage offsets in shared memory while their query loads, and the producer meets them at
// kTopkBarrier before its first tile with top-k columns. Thread i of n takes entries i + n k,
// four at a time (each batch one top-k load and one block-table load deep).
constexpr int kTopkBatch = 4;

// How many of producer thread i's entries are >= 0.
__device__ __forceinline__ int count_topk(const DecodeParams& p, int token, int i) {
  const int32_t* row = p.topk.indices + int64_t(token) * p.topk.stride;
  int count = 0;
  for (int base = i; base < p.topk.top_k; base += kTopkBatch * 128) {
    int32_t x[kTopkBatch];
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b)
      x[b] = base + b * 128 < p.topk.top_k ? __ldg(row + base + b * 128) : -1;
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) count += x[b] >= 0;
  }
  return count;
}

// Consumer thread i's entries as the table build would write them (SPEC §4) into `staged`.
__device__ __forceinline__ void stage_topk(const DecodeParams& p, int token, int request, int i,
                                           int32_t* staged) {
  const TopkParams& k = p.topk;
  const uint32_t entries = p.compressed.block_size;
  const int32_t* row = k.indices + int64_t(token) * k.stride;
  // A token past cum_seq_lens_q[B] (unchecked on the device) reads the last request's row.
  const int32_t* table = k.block_table + int64_t(min(request, p.num_requests - 1)) * k.table_stride;
  for (int base = i; base < k.top_k; base += kTopkBatch * 256) {
    int32_t x[kTopkBatch], page_id[kTopkBatch];
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b)
      x[b] = base + b * 256 < k.top_k ? __ldg(row + base + b * 256) : -1;
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) {
      const bool paged = x[b] >= 0 && uint32_t(x[b]) / entries < uint32_t(k.pages);
      page_id[b] = paged ? __ldg(table + uint32_t(x[b]) / entries) : -1;
    }
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) {
      if (base + b * 256 >= k.top_k) continue;
      const bool paged = x[b] >= 0 && uint32_t(x[b]) / entries < uint32_t(k.pages);
      staged[base + b * 256] =
          x[b] < 0  ? x[b]
          : !paged ? -1
                   : rules::page_offset(page_id[b], uint32_t(x[b]) % entries, entries,
                                        p.compressed.span.divisor);
    }
  }
  ptx::named_arrive(kTopkBarrier, kThreads);
}

}  // namespace smla::cuda
