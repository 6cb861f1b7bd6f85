// How a decode launch is cut into CTAs (head blocks x KV splits), and the workspace it needs.
#pragma once
#include <cstddef>
#include <cstdint>

namespace smla::cuda {

constexpr int kMmaRows = 64;           // the wgmma M dimension: query heads a CTA computes
constexpr int kMinHeadsPerCta = 16;    // small batches use 16 or 32 live heads per CTA
constexpr int kTileColumns = 32;       // KV rows gathered per pipeline stage
constexpr int kMaxSplits = 32;         // CTAs one row's columns may be split over
constexpr int kMaxTopk = 2048;         // TopkColumns' width on CUDA (staged in shared memory)

// Split partials, per (token, head block, split): heads_per_cta x 512 f32 unnormalized
// outputs, then heads_per_cta x (m, l).
constexpr size_t partial_floats(int heads_per_cta) { return size_t(heads_per_cta) * (512 + 2); }

struct DecodePlan {
  int heads_per_cta = kMmaRows;  // 16, 32 or 64 live heads per CTA
  int head_blocks = 1;
  int num_splits = 1;
  int tiles_per_split = 1;
  int64_t ctas = 0;
  size_t workspace_bytes = 0;  // 0 when num_splits == 1
  size_t counter_bytes = 0;    // 0 when num_splits == 1
};

// The plan with the lowest modelled time for the shape on `sm_count` SMs; it splits a row's
// columns only while that fills the GPU. `workspace_limit` / `counter_limit` cap what the
// plan may use (SIZE_MAX = unlimited): a smaller buffer means fewer splits, never a race.
DecodePlan plan_decode(int64_t num_tokens, int num_heads, int64_t num_columns, int sm_count,
                       size_t workspace_limit, size_t counter_limit);

// Workspace enough for every plan of `num_heads` heads with at most `num_tokens` tokens and
// `num_columns` columns: fewer of either may split more.
size_t workspace_bound(int64_t num_tokens, int num_heads, int64_t num_columns, int sm_count);

}  // namespace smla::cuda
