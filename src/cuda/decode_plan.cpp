#include "cuda/decode_plan.h"

#include <algorithm>

namespace smla::cuda {
namespace {

// Cost model in microseconds, fitted to H200 measurements (docs/benchmarks.md): a 32-row
// tile costs one 64-row wgmma pass whatever the live heads; a split row pays a fixed
// publish/arrive cost plus, in its last CTA, one L2 round trip and the bytes of each partial
// (one SM reads them back at about 50 GB/s).
constexpr double kTileUs = 1.8;
constexpr double kSplitFixedUs = 1.0;
constexpr double kPartialLatencyUs = 0.5;
constexpr double kPartialBytesPerUs = 50e3;

}  // namespace

DecodePlan plan_decode(int64_t num_tokens, int num_heads, int64_t num_columns, int sm_count,
                       size_t workspace_limit, size_t counter_limit) {
  const int64_t tiles = std::max<int64_t>(1, (num_columns + kTileColumns - 1) / kTileColumns);
  DecodePlan best;
  double best_cost = -1;
  for (int heads_per_cta = kMmaRows; heads_per_cta >= kMinHeadsPerCta; heads_per_cta /= 2) {
    const int head_blocks = (num_heads + heads_per_cta - 1) / heads_per_cta;
    const int64_t rows = num_tokens * head_blocks;
    const size_t partial_bytes = partial_floats(heads_per_cta) * sizeof(float);
    for (int splits = 1; splits <= std::min<int64_t>(tiles, kMaxSplits); ++splits) {
      const int64_t tiles_per_split = (tiles + splits - 1) / splits;
      if ((splits - 1) * tiles_per_split >= tiles) continue;  // an idle split: same as fewer
      const int64_t ctas = rows * splits;
      const size_t workspace = splits > 1 ? size_t(ctas) * partial_bytes : 0;
      const size_t counters = splits > 1 ? size_t(rows) * sizeof(int32_t) : 0;
      if (workspace > workspace_limit || counters > counter_limit) break;
      if (splits > 1 && ctas > 2 * int64_t(sm_count)) break;  // past 2 waves splitting buys nothing
      const int64_t waves = (ctas + sm_count - 1) / sm_count;
      double cost = double(waves) * double(tiles_per_split) * kTileUs;
      if (splits > 1)
        cost += kSplitFixedUs + splits * (kPartialLatencyUs + partial_bytes / kPartialBytesPerUs);
      if (best_cost < 0 || cost < best_cost - 1e-9) {
        best_cost = cost;
        best = {heads_per_cta, head_blocks, splits,  int(tiles_per_split),
                ctas,          workspace,   counters};
      }
    }
  }
  return best;
}

size_t workspace_bound(int64_t num_tokens, int num_heads, int64_t num_columns, int sm_count) {
  // Past sm_count rows of 64 heads no plan splits (splitting stops at two waves).
  const int64_t tiles = (num_columns + kTileColumns - 1) / kTileColumns;
  const int64_t blocks = (num_heads + kMmaRows - 1) / kMmaRows;
  size_t most = 0;
  for (int64_t t = 1; t <= num_tokens && t * blocks <= sm_count; ++t)
    for (int64_t tile = 1; tile <= tiles; ++tile)
      most = std::max(most,
                      plan_decode(t, num_heads, tile * kTileColumns, sm_count, SIZE_MAX, SIZE_MAX)
                          .workspace_bytes);
  return most;
}

}  // namespace smla::cuda
