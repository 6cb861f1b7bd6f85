#include "cuda/decode_plan.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/problem.h"

namespace smla::cuda {
namespace {

// Cost model in microseconds, fitted to H200 times of forced plans (docs/kernel_measured.md, "Work
// decomposition"). A 32-row tile costs one 64-row wgmma pass whatever the live heads; a bf16
// cache's tiles are cheaper (no conversion pass paces them), most of all on unsplit rows of 64
// heads, which run the kQueryTma kernel. A wave's split rows are reduced before the next wave
// gets their SMs: the reduction is paid once per wave. Through the counters every CTA stores its
// f32 partial and the row's last CTA reads all of them back; over a cluster, each CTA reads one
// CTA's bf16 O rows' bytes in all.
constexpr double kTileUs = 1.3;
constexpr double kBf16TileUs = 0.9;
constexpr double kBf16QueryTmaTileUs = 0.8;
constexpr double kSplitFixedUs = 1.5;
constexpr double kPartialStoreBytesPerUs = 24e3;
constexpr double kPartialBytesPerUs = 45e3;
constexpr double kClusterFixedUs = 1.0;
constexpr double kClusterBytesPerUs = 16e3;
// A wave's tiles come no faster than DRAM gathers them: its CTAs' rows, a token's head blocks
// counted once (the later ones read them from L2), at this fraction of the peak bandwidth
// (random 1 KiB rows: an H100 3.04-3.15 of 3.35 TB/s, an H200 4.2-4.5 of 4.8). No H200 plan
// changes (nor any down to 4.2 TB/s); an H100 splits bf16 rows of 14-78 tokens less, the
// fraction chosen from 100 shapes timed there (docs/kernel_measured.md, "Work decomposition").
constexpr double kGatherFraction = 0.95;

// Whether rows split over CTAs of `heads_per_cta` heads: not where half as many cover the heads
// in as many blocks, whose smaller partials cost less to reduce at the same CTA count (so the
// wider plan could never win; the workspace bound counts on this too).
bool splits_at(int num_heads, int heads_per_cta) {
  const int half = heads_per_cta / 2;
  return heads_per_cta == kMinHeadsPerCta ||
         (num_heads + half - 1) / half > (num_heads + heads_per_cta - 1) / heads_per_cta;
}

}  // namespace

Occupancy uniform_occupancy(int sm_count, bool clusters) {
  Occupancy o;
  o.ctas = sm_count;
  for (int c = 2; c <= kMaxClusterSplits; ++c) o.cluster_ctas[c] = clusters ? sm_count / c * c : 0;
  return o;
}

DecodePlan plan_decode(int64_t num_tokens, int num_heads, int64_t num_columns, KvLayout layout,
                       const Occupancy& occupancy, size_t workspace_limit, size_t counter_limit) {
  const int64_t tiles = std::max<int64_t>(1, (num_columns + kTileColumns - 1) / kTileColumns);
  DecodePlan best;
  double best_cost = -1;
  const auto consider = [&](const DecodePlan& plan, int concurrent, double reduce_us) {
    const bool query_tma = plan.num_splits == 1 && plan.heads_per_cta == kMmaRows;
    const double sm_us = layout != KvLayout::bf16 ? kTileUs
                         : query_tma              ? kBf16QueryTmaTileUs
                                                  : kBf16TileUs;
    const auto wave_us = [&](int64_t ctas) {  // a wave of `ctas` CTAs at once
      double tile_us = sm_us;
      if (occupancy.dram_bytes_per_us > 0)
        tile_us = std::max(tile_us, double(ctas) / plan.head_blocks * kTileColumns *
                                        double(kv_row_bytes(layout)) /
                                        (kGatherFraction * occupancy.dram_bytes_per_us));
      return double(plan.tiles_per_split) * tile_us + reduce_us;
    };
    const int64_t full_waves = plan.ctas / concurrent, rest = plan.ctas % concurrent;
    const double cost = double(full_waves) * wave_us(concurrent) + (rest > 0 ? wave_us(rest) : 0);
    if (best_cost < 0 || cost < best_cost - 1e-9) best_cost = cost, best = plan;
  };
  for (int heads_per_cta = kMmaRows; heads_per_cta >= kMinHeadsPerCta; heads_per_cta /= 2) {
    const int head_blocks = (num_heads + heads_per_cta - 1) / heads_per_cta;
    const int64_t rows = num_tokens * head_blocks;
    const size_t partial_bytes = partial_floats(heads_per_cta) * sizeof(float);
    const int max_splits = splits_at(num_heads, heads_per_cta) ? kMaxSplits : 1;
    for (int splits = 1; splits <= std::min<int64_t>(tiles, max_splits); ++splits) {
      DecodePlan plan;
      plan.heads_per_cta = heads_per_cta;
      plan.head_blocks = head_blocks;
      plan.num_splits = splits;
      plan.tiles_per_split = int((tiles + splits - 1) / splits);
      plan.ctas = rows * splits;
      if ((splits - 1) * int64_t(plan.tiles_per_split) >= tiles) continue;  // an idle split
      if (splits == 1) {
        consider(plan, occupancy.ctas, 0);
        continue;
      }
      if (plan.ctas > 2 * int64_t(occupancy.ctas)) break;  // past 2 waves splitting buys nothing
      // Past the portable size only for CTAs of up to 32 heads: 64-head CTAs in clusters of 9
      // measured 0-3% slower than the 32-head clusters of 6 the model had priced 5% dearer.
      const int max_cluster =
          heads_per_cta <= kMmaRows / 2 ? kMaxClusterSplits : kPortableClusterCtas;
      if (splits <= max_cluster && occupancy.cluster_ctas[splits] > 0) {
        DecodePlan clustered = plan;
        clustered.cluster = true;
        consider(clustered, occupancy.cluster_ctas[splits],
                 kClusterFixedUs + double(heads_per_cta * 512 * 2) / kClusterBytesPerUs);
      }
      plan.workspace_bytes = size_t(plan.ctas) * partial_bytes;
      plan.counter_bytes = size_t(rows) * sizeof(int32_t);
      if (plan.workspace_bytes <= workspace_limit && plan.counter_bytes <= counter_limit)
        consider(plan, occupancy.ctas,
                 kSplitFixedUs + double(partial_bytes) / kPartialStoreBytesPerUs +
                     splits * double(partial_bytes) / kPartialBytesPerUs);
    }
  }
  return best;
}

size_t workspace_bound(int64_t num_tokens, int num_heads, int64_t num_columns,
                       const Occupancy& occupancy) {
  // A counter-reduced plan has at most two waves of CTAs of at most 64 heads: past
  // kExactBoundTiles that cap is the bound, so a huge width costs no plan search per tile.
  const size_t cap = 2 * size_t(occupancy.ctas) * partial_floats(kMmaRows) * sizeof(float);
  const int64_t tiles = (num_columns + kTileColumns - 1) / kTileColumns;
  if (tiles > kExactBoundTiles) return cap;
  // The most any plan of t tokens can use: its widest split rows' partials, up to two waves.
  const auto most_at = [&](int64_t t) {
    size_t bytes = 0;
    for (int heads_per_cta = kMmaRows; heads_per_cta >= kMinHeadsPerCta; heads_per_cta /= 2) {
      const int64_t rows = t * ((num_heads + heads_per_cta - 1) / heads_per_cta);
      const int64_t splits = std::min({tiles, int64_t(kMaxSplits), 2 * occupancy.ctas / rows});
      if (splits > 1 && splits_at(num_heads, heads_per_cta))
        bytes =
            std::max(bytes, size_t(rows * splits) * partial_floats(heads_per_cta) * sizeof(float));
    }
    return bytes;
  };
  // Past sm_count rows of 64 heads no plan splits (splitting stops at two waves). Token counts
  // go from the largest such most down, and one whose plans cannot pass the largest workspace
  // found so far is not searched.
  const int64_t blocks = (num_heads + kMmaRows - 1) / kMmaRows;
  std::vector<std::pair<size_t, int64_t>> order;  // (most_at(t), t)
  for (int64_t t = 1; t <= num_tokens && t * blocks <= occupancy.ctas; ++t)
    order.emplace_back(most_at(t), t);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  size_t most = 0;
  for (const auto& [most_t, t] : order) {
    for (int64_t tile = 1; tile <= tiles && most < most_t; ++tile)
      for (KvLayout layout : kKvLayouts)
        most = std::max(most, plan_decode(t, num_heads, tile * kTileColumns, layout, occupancy,
                                          SIZE_MAX, SIZE_MAX)
                                  .workspace_bytes);
  }
  return most;
}

}  // namespace smla::cuda
