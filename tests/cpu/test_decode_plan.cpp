// The CUDA launch planner is host code: its contracts are checked here, without a GPU.
#include <gtest/gtest.h>

#if SMLA_WITH_CUDA
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/decode_plan.h"
#include "smla/decode.h"

namespace smla::cuda {
namespace {

constexpr int kSms = 132;
const Occupancy kGpu = uniform_occupancy(kSms);
const Occupancy kNoClusters = uniform_occupancy(kSms, false);
// An H200's clusters of 2..16 CTAs at once, as cudaOccupancyMaxActiveClusters says.
const Occupancy kH200 = [] {
  Occupancy h200 = kGpu;
  h200.cluster_ctas = {0, 0, 132, 117, 120, 110, 102, 105, 120, 81, 70, 77, 84, 91, 98, 105, 112};
  return h200;
}();

TEST(DecodePlan, CoversEveryColumnOnceWithoutIdleSplits) {
  for (int64_t tokens : {1, 2, 4, 16, 64, 256, 1024})
    for (int heads : {1, 8, 16, 24, 64, 100, 128})
      for (int64_t columns : {0, 4, 33, 128, 256, 640, 1000, 1152, 2176}) {
        for (const auto& [gpu, layout] :
             {std::pair{kGpu, KvLayout::bf16}, std::pair{kNoClusters, KvLayout::bf16},
              std::pair{kGpu, KvLayout::fp8_ds_mla}, std::pair{kGpu, KvLayout::fp8_e4m3}}) {
          const DecodePlan plan =
              plan_decode(tokens, heads, columns, layout, gpu, SIZE_MAX, SIZE_MAX);
          // A row of no columns still takes one tile: its CTA writes the empty row's output.
          const int64_t tiles = std::max<int64_t>(1, (columns + kTileColumns - 1) / kTileColumns);
          EXPECT_GE(int64_t(plan.num_splits) * plan.tiles_per_split, tiles);
          EXPECT_LT(int64_t(plan.num_splits - 1) * plan.tiles_per_split, tiles);
          EXPECT_LE(plan.num_splits, kMaxSplits);
          EXPECT_EQ(plan.head_blocks, (heads + plan.heads_per_cta - 1) / plan.heads_per_cta);
          EXPECT_EQ(plan.ctas, tokens * plan.head_blocks * plan.num_splits);
          if (plan.num_splits > 1) EXPECT_LE(plan.ctas, 2 * kSms);
          EXPECT_LE(plan.counter_bytes, smla::kv_counter_bytes(tokens, heads));
          if (plan.cluster) {  // a cluster per split row, no buffers
            EXPECT_LE(plan.num_splits, kMaxClusterSplits);
            // Past the portable 8 CTAs only for CTAs of up to 32 heads (decode_plan.h).
            if (plan.heads_per_cta > kMmaRows / 2) EXPECT_LE(plan.num_splits, kPortableClusterCtas);
            EXPECT_GT(gpu.cluster_ctas[plan.num_splits], 0);
            EXPECT_EQ(plan.workspace_bytes + plan.counter_bytes, 0u);
          } else if (plan.num_splits > 1) {  // through the counters: a counter per split row and
            // a partial of heads x 512 f32 outputs and heads x (m, l) per CTA (SPEC §3)
            EXPECT_EQ(plan.workspace_bytes, size_t(plan.ctas) * plan.heads_per_cta * 514 * 4);
            EXPECT_EQ(plan.counter_bytes, size_t(tokens * plan.head_blocks) * 4);
          } else {
            EXPECT_EQ(plan.workspace_bytes + plan.counter_bytes, 0u);
          }
          // Narrower CTAs only for split rows, so that their partials are smaller, and then no
          // wider than the heads need.
          const int fit = heads <= 16 ? 16 : heads <= 32 ? 32 : kMmaRows;
          if (plan.num_splits == 1) EXPECT_EQ(plan.heads_per_cta, kMmaRows);
          else EXPECT_LE(plan.heads_per_cta, fit);
        }
      }
}

// The shapes of the issues' small batches split over clusters; without clusters, over counters.
TEST(DecodePlan, SmallBatchesSplitInClustersElseThroughCounters) {
  for (int heads : {64, 128}) {
    const DecodePlan clustered =
        plan_decode(4, heads, 128 + 8 * heads, KvLayout::bf16, kGpu, SIZE_MAX, SIZE_MAX);
    EXPECT_TRUE(clustered.cluster) << heads;
    EXPECT_GT(clustered.num_splits, 1) << heads;
    const DecodePlan counted =
        plan_decode(4, heads, 128 + 8 * heads, KvLayout::bf16, kNoClusters, SIZE_MAX, SIZE_MAX);
    EXPECT_FALSE(counted.cluster) << heads;
    EXPECT_GT(counted.num_splits, 1) << heads;
    EXPECT_GT(counted.workspace_bytes, 0u) << heads;
  }
}

// A wave's counter reductions hold their SMs from the next wave: 64 heads, 80 tokens, 640
// columns measured 60.2 us split 3 ways through the counters (240 CTAs), 26.4 us unsplit.
TEST(DecodePlan, CounterReductionsStayInOneWave) {
  for (const Occupancy& gpu : {kH200, kNoClusters})  // and where every split row is counted
    for (KvLayout layout : kKvLayouts)
      for (int heads : {64, 100, 128})
        for (int64_t columns : {640, 1152})
          for (int64_t tokens = 1; tokens * ((heads + kMmaRows - 1) / kMmaRows) <= kSms;
               ++tokens) {
            const DecodePlan plan =
                plan_decode(tokens, heads, columns, layout, gpu, SIZE_MAX, SIZE_MAX);
            if (plan.num_splits > 1 && !plan.cluster)
              EXPECT_LE(plan.ctas, kSms) << heads << " heads, " << tokens << " tokens, " << columns;
          }
}

// Choices docs/kernel.md and kernel_measured.md describe, each resting on one term of the cost
// model or one bound (a refit that changes one changes those docs too): splits up to exactly two
// waves; 16-CTA clusters for 32-head CTAs; the cluster and read-back costs keeping H=8 at 42
// tokens to 2 splits in clusters; the query-TMA tile price keeping 64-head rows unsplit.
TEST(DecodePlan, PlansTheDocsDescribe) {
  struct Expected {
    int64_t tokens;
    int heads;
    int64_t columns;
    KvLayout layout;
    const Occupancy& gpu;
    int heads_per_cta, num_splits;
    bool cluster;
  };
  for (const Expected& e : {Expected{24, 8, 2112, KvLayout::fp8_e4m3, kGpu, 16, 11, true},
                            Expected{5, 32, 1152, KvLayout::bf16, kH200, 32, 12, true},
                            Expected{42, 8, 640, KvLayout::bf16, kH200, 16, 2, true},
                            Expected{32, 16, 1152, KvLayout::fp8_ds_mla, kH200, 16, 4, false},
                            Expected{32, 64, 256, KvLayout::bf16, kH200, 64, 1, false}}) {
    const DecodePlan plan =
        plan_decode(e.tokens, e.heads, e.columns, e.layout, e.gpu, SIZE_MAX, SIZE_MAX);
    const auto shape = std::to_string(e.tokens) + " tokens, H=" + std::to_string(e.heads) + ", " +
                       std::to_string(e.columns) + " columns";
    EXPECT_EQ(plan.heads_per_cta, e.heads_per_cta) << shape;
    EXPECT_EQ(plan.num_splits, e.num_splits) << shape;
    EXPECT_EQ(plan.cluster, e.cluster) << shape;
  }
  EXPECT_EQ(plan_decode(24, 8, 2112, KvLayout::fp8_e4m3, kGpu, SIZE_MAX, SIZE_MAX).ctas, 2 * kSms);
  // A split left idle never pays, even where only 16-CTA clusters fit (128 at once).
  Occupancy only16 = uniform_occupancy(kSms, false);
  only16.cluster_ctas[16] = 128;
  const DecodePlan plan = plan_decode(1, 16, 960, KvLayout::bf16, only16, SIZE_MAX, SIZE_MAX);
  EXPECT_LT(int64_t(plan.num_splits - 1) * plan.tiles_per_split, 960 / kTileColumns);
}

TEST(DecodePlan, SmallBuffersMeanFewerSplitsNeverMore) {
  for (size_t limit : {size_t(0), size_t(4), size_t(1) << 16, size_t(1) << 20}) {
    for (const Occupancy& gpu : {kGpu, kNoClusters}) {
      const DecodePlan plan = plan_decode(2, 64, 640, KvLayout::bf16, gpu, limit, limit);
      EXPECT_LE(plan.workspace_bytes, limit);
      EXPECT_LE(plan.counter_bytes, limit);
    }
  }
  EXPECT_EQ(plan_decode(2, 64, 640, KvLayout::bf16, kNoClusters, 0, 0).num_splits, 1);
}

// Each limit caps its own buffer, and buffers of exactly the bytes a plan needs allow it (the
// workspace workspace_bound sizes serves the plan it was sized for).
TEST(DecodePlan, EachLimitAloneCapsItsBufferAndAnExactFitAllowsThePlan) {
  const DecodePlan counted =
      plan_decode(2, 64, 640, KvLayout::bf16, kNoClusters, SIZE_MAX, SIZE_MAX);
  ASSERT_GT(counted.num_splits, 1);
  ASSERT_FALSE(counted.cluster);
  EXPECT_EQ(plan_decode(2, 64, 640, KvLayout::bf16, kNoClusters, SIZE_MAX, 0).num_splits, 1);
  EXPECT_EQ(plan_decode(2, 64, 640, KvLayout::bf16, kNoClusters, 0, SIZE_MAX).num_splits, 1);
  for (const auto& [workspace, counters] :
       {std::pair{counted.workspace_bytes, counted.counter_bytes},
        std::pair{counted.workspace_bytes, SIZE_MAX}, std::pair{SIZE_MAX, counted.counter_bytes}}) {
    const DecodePlan exact =
        plan_decode(2, 64, 640, KvLayout::bf16, kNoClusters, workspace, counters);
    EXPECT_EQ(exact.num_splits, counted.num_splits) << workspace << ", " << counters;
    EXPECT_EQ(exact.heads_per_cta, counted.heads_per_cta) << workspace << ", " << counters;
    EXPECT_EQ(exact.workspace_bytes, counted.workspace_bytes) << workspace << ", " << counters;
  }
}

// Clusters are priced at the clusters the device runs at once: where that is one cluster, a
// batch that would fill the GPU in one wave of clusters does not split in clusters.
TEST(DecodePlan, ClustersArePricedAtTheirOwnOccupancy) {
  Occupancy one_cluster = kGpu;
  for (int c = 2; c <= kMaxClusterSplits; ++c) one_cluster.cluster_ctas[c] = c;
  for (KvLayout layout : kKvLayouts)
    for (int64_t tokens : {16, 32, 64}) {
      const DecodePlan plan =
          plan_decode(tokens, 64, 640, layout, one_cluster, SIZE_MAX, SIZE_MAX);
      EXPECT_FALSE(plan.cluster) << tokens << " tokens, " << plan.num_splits << " splits";
    }
}

// Where the wave's row copies would outrun DRAM, a tile costs what DRAM takes to gather it: on
// an H100's 3.35 TB/s bf16 rows of 64 tokens, H=64, 640 columns stay one CTA a row (26.0 us
// where two splits took 27.6); an H200's 4.8 TB/s plans as the SM's prices alone, in every
// layout, and so does an unknown bandwidth.
TEST(DecodePlan, TilesCostNoLessThanDramGathersThem) {
  Occupancy h100 = kH200, h200 = kH200;
  h100.dram_bytes_per_us = 3.35e6;
  h200.dram_bytes_per_us = 4.8e6;
  const auto same = [](const DecodePlan& a, const DecodePlan& b) {
    return a.heads_per_cta == b.heads_per_cta && a.num_splits == b.num_splits &&
           a.cluster == b.cluster;
  };
  const DecodePlan sm = plan_decode(64, 64, 640, KvLayout::bf16, kH200, SIZE_MAX, SIZE_MAX);
  EXPECT_EQ(sm.num_splits, 2);
  EXPECT_TRUE(sm.cluster);
  const DecodePlan dram = plan_decode(64, 64, 640, KvLayout::bf16, h100, SIZE_MAX, SIZE_MAX);
  EXPECT_EQ(dram.num_splits, 1);
  EXPECT_EQ(dram.heads_per_cta, kMmaRows);
  // A partial last wave gathers only its own CTAs' rows: 133 tokens stay 64-head CTAs.
  EXPECT_EQ(plan_decode(133, 64, 640, KvLayout::bf16, h100, SIZE_MAX, SIZE_MAX).heads_per_cta,
            kMmaRows);
  for (KvLayout layout : kKvLayouts)
    for (int heads : {8, 16, 32, 64, 100, 128})
      for (int64_t columns : {640, 1152})
        for (int64_t tokens = 1; tokens < 300; ++tokens) {
          const DecodePlan a =
              plan_decode(tokens, heads, columns, layout, kH200, SIZE_MAX, SIZE_MAX);
          EXPECT_TRUE(
              same(a, plan_decode(tokens, heads, columns, layout, h200, SIZE_MAX, SIZE_MAX)))
              << tokens << " tokens, H=" << heads << ", " << columns << " columns";
          // The fp8 layouts' conversion paces them below an H100's DRAM too.
          if (layout != KvLayout::bf16)
            EXPECT_TRUE(
                same(a, plan_decode(tokens, heads, columns, layout, h100, SIZE_MAX, SIZE_MAX)));
        }
}

TEST(DecodePlan, UniformOccupancyIsWholeClustersOfEverySize) {
  const Occupancy none = uniform_occupancy(kSms, false);
  EXPECT_EQ(kGpu.ctas, kSms);
  EXPECT_EQ(none.ctas, kSms);
  for (int c = 2; c <= kMaxClusterSplits; ++c) {
    EXPECT_EQ(kGpu.cluster_ctas[c], kSms / c * c) << c;
    EXPECT_EQ(none.cluster_ctas[c], 0) << c;
  }
}

// The bound is the most any plan of at most that many tokens and columns uses: enough for
// every one, and no more (its search skips token counts that cannot pass what it has found).
TEST(DecodePlan, WorkspaceBoundIsTheMostOfEverySmallerLaunch) {
  for (int heads : {8, 20, 64, 128})
    for (const auto& [tokens, columns] : {std::pair<int64_t, int64_t>{1, 1152},
                                          {3, 1152},
                                          {16, 1152},
                                          {40, 1152},
                                          {12, 20000},
                                          {40, 8000}}) {
      for (const Occupancy& gpu : {kGpu, kNoClusters}) {
        const size_t bound = workspace_bound(tokens, heads, columns, gpu);
        size_t most = 0;
        for (int64_t t = 1; t <= tokens; ++t)
          for (int64_t width = kTileColumns; width < columns + kTileColumns; width += kTileColumns)
            for (KvLayout layout : kKvLayouts)
              most = std::max(most, plan_decode(t, heads, std::min(width, columns), layout, gpu,
                                                SIZE_MAX, SIZE_MAX)
                                        .workspace_bytes);
        EXPECT_EQ(bound, most) << heads << " heads, " << tokens << " tokens, " << columns
                               << " columns";
        // H=8 at 40 tokens x 8000 columns: plans through the counters over two waves of CTAs
        // (the first such plans come at 34-37 tokens and 5600-6944 columns).
        if (heads == 8 && columns == 8000)
          EXPECT_GT(most, size_t(kSms) * partial_floats(kMinHeadsPerCta) * sizeof(float));
      }
    }
}

// Past kExactBoundTiles the bound is the two-wave cap, computed without a plan search per tile
// (a width of 2^31 - 1 columns would have taken ~45 minutes), and no plan there exceeds it.
TEST(DecodePlan, WorkspaceBoundOfAHugeWidthIsTheTwoWaveCap) {
  for (const Occupancy& gpu : {kGpu, kNoClusters}) {
    const size_t cap = 2 * size_t(gpu.ctas) * partial_floats(kMmaRows) * sizeof(float);
    EXPECT_EQ(workspace_bound(40, 128, INT32_MAX, gpu), cap);
    EXPECT_LE(workspace_bound(40, 128, kExactBoundTiles * kTileColumns, gpu), cap);
    // Up to kExactBoundTiles the bound is the plans' own: one token's split rows are far from
    // two waves of 64-head partials.
    EXPECT_LT(workspace_bound(1, 128, kExactBoundTiles * kTileColumns, gpu), cap);
    for (int64_t t : {1, 9, 40, 132})
      for (KvLayout layout : kKvLayouts)
        EXPECT_LE(plan_decode(t, 128, INT32_MAX, layout, gpu, SIZE_MAX, SIZE_MAX).workspace_bytes,
                  cap)
            << t << " tokens";
  }
}

}  // namespace
}  // namespace smla::cuda
#endif
