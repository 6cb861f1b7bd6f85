// How a decode launch is cut into CTAs (head blocks x KV splits), how a split row is reduced,
// and the workspace it needs.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "smla/decode.h"

namespace smla::cuda {

constexpr int kMmaRows = 64;             // the wgmma M dimension: query heads a CTA computes
constexpr int kMinHeadsPerCta = 16;      // small batches use 16 or 32 live heads per CTA
constexpr int kTileColumns = 32;         // KV rows gathered per pipeline stage
constexpr int kMaxSplits = 32;           // CTAs one row's columns may be split over
constexpr int kPortableClusterCtas = 8;  // larger clusters need a kernel attribute
constexpr int kMaxClusterSplits = 16;    // splits reduced in a cluster (past 8: <= 32 heads)
constexpr int kMaxTopk = 2048;           // TopkColumns' width on CUDA (staged in shared memory)
// A query read by TMA of at least this many bytes is evicted first from L2 (decode_launch.cu)
constexpr int64_t kQueryEvictFirstBytes = int64_t(10) << 20;

// Split partials, per (token, head block, split): heads_per_cta x 512 f32 unnormalized
// outputs, then heads_per_cta x (m, l).
constexpr size_t partial_floats(int heads_per_cta) { return size_t(heads_per_cta) * (512 + 2); }

// CTAs of the decode kernel that run at once: alone (one per SM), and launched in clusters of
// c CTAs (cluster_ctas[c], c = 2..kMaxClusterSplits; 0 = no such clusters); and the device's
// peak DRAM bandwidth that their row copies share (0: not known, tiles priced by the SM alone).
struct Occupancy {
  int ctas = 0;
  std::array<int, kMaxClusterSplits + 1> cluster_ctas{};
  double dram_bytes_per_us = 0;
};
// Every SM usable by clusters of any size (for host-side tests); clusters false: none.
Occupancy uniform_occupancy(int sm_count, bool clusters = true);

struct DecodePlan {
  int heads_per_cta = kMmaRows;  // 16, 32 or 64 live heads per CTA
  int head_blocks = 1;
  int num_splits = 1;
  int tiles_per_split = 1;
  // Split rows: reduced through distributed shared memory by the row's cluster of num_splits
  // CTAs (no workspace, no counters), or else through the counters and the workspace (SPEC §3).
  bool cluster = false;
  int64_t ctas = 0;
  size_t workspace_bytes = 0;  // 0 unless split rows go through the counters
  size_t counter_bytes = 0;    // 0 unless split rows go through the counters
};

// The plan with the lowest modelled time for the shape and cache layout; it splits a row's
// columns only while that fills the GPU. `workspace_limit` / `counter_limit` cap what a
// counter-reduced plan may use (SIZE_MAX = unlimited): a smaller buffer means fewer such
// splits, never a race.
DecodePlan plan_decode(int64_t num_tokens, int num_heads, int64_t num_columns, KvLayout layout,
                       const Occupancy& occupancy, size_t workspace_limit, size_t counter_limit);

// Workspace enough for every plan of `num_heads` heads with at most `num_tokens` tokens and
// `num_columns` columns, in any cache layout: fewer of either may split more. Past
// kExactBoundTiles tiles of columns, the most any plan can use (two waves of 64-head partials).
inline constexpr int64_t kExactBoundTiles = 4096;
size_t workspace_bound(int64_t num_tokens, int num_heads, int64_t num_columns,
                       const Occupancy& occupancy);

}  // namespace smla::cuda
