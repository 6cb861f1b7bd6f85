// The CUDA launch planner is host code: its contracts are checked here, without a GPU.
#include <gtest/gtest.h>

#if SMLA_WITH_CUDA
#include <cstdint>

#include "cuda/decode_plan.h"
#include "smla/decode.h"

namespace smla::cuda {
namespace {

constexpr int kSms = 132;

TEST(DecodePlan, CoversEveryColumnOnceWithoutIdleSplits) {
  for (int64_t tokens : {1, 2, 4, 16, 64, 256, 1024})
    for (int heads : {1, 8, 16, 24, 64, 100, 128})
      for (int64_t columns : {4, 128, 256, 640, 1152, 2176}) {
        const DecodePlan plan = plan_decode(tokens, heads, columns, kSms, SIZE_MAX, SIZE_MAX);
        const int64_t tiles = (columns + kTileColumns - 1) / kTileColumns;
        EXPECT_GE(int64_t(plan.num_splits) * plan.tiles_per_split, tiles);
        EXPECT_LT(int64_t(plan.num_splits - 1) * plan.tiles_per_split, tiles);
        EXPECT_LE(plan.num_splits, kMaxSplits);
        EXPECT_EQ(plan.head_blocks, (heads + plan.heads_per_cta - 1) / plan.heads_per_cta);
        EXPECT_EQ(plan.ctas, tokens * plan.head_blocks * plan.num_splits);
        if (plan.num_splits > 1) EXPECT_LE(plan.ctas, 2 * kSms);
        EXPECT_LE(plan.counter_bytes, smla::kv_counter_bytes(tokens, heads));
      }
}

TEST(DecodePlan, SmallBuffersMeanFewerSplitsNeverMore) {
  for (size_t limit : {size_t(0), size_t(4), size_t(1) << 16, size_t(1) << 20}) {
    const DecodePlan plan = plan_decode(2, 64, 640, kSms, limit, limit);
    EXPECT_LE(plan.workspace_bytes, limit);
    EXPECT_LE(plan.counter_bytes, limit);
  }
  EXPECT_EQ(plan_decode(2, 64, 640, kSms, 0, 0).num_splits, 1);
}

TEST(DecodePlan, WorkspaceBoundServesEverySmallerLaunch) {
  for (int heads : {8, 64, 128})
    for (int64_t tokens : {1, 3, 16, 40}) {
      const size_t bound = workspace_bound(tokens, heads, 1152, kSms);
      for (int64_t t = 1; t <= tokens; ++t)
        for (int64_t columns = 4; columns <= 1152; columns += 4)
          ASSERT_LE(plan_decode(t, heads, columns, kSms, SIZE_MAX, SIZE_MAX).workspace_bytes, bound)
              << heads << " heads, " << t << " tokens, " << columns << " columns";
    }
}

}  // namespace
}  // namespace smla::cuda
#endif
