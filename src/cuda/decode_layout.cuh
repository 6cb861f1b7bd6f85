// Where the decode kernel keeps things: its constants, the shared-memory map, the 128B swizzle
// and which (token, head block, split) a CTA computes.
#pragma once
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "core/index_rules.h"
#include "cuda/decode_params.h"
#include "cuda/decode_plan.h"
#include "cuda/ptx.cuh"
#include "smla/decode.h"

namespace smla::cuda {

constexpr int kThreads = 384;                       // producer + 2 consumer warpgroups
constexpr int kQChunkBytes = kMmaRows * 128;        // 64 heads x 64 dims, bf16, swizzled
constexpr int kKvChunkBytes = kTileColumns * 128;   // 32 rows x 64 dims
constexpr int kTileBytes = 8 * kKvChunkBytes;       // one stage: 32 rows x 512 dims, bf16
constexpr int kScores = kTileColumns / 2;           // score registers per consumer thread
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// bf16 tiles in flight. fp8 layouts trade one stage for two raw tiles (RawTile), which the
// producer fills asynchronously and converts, so that two tiles of fp8 rows are in flight.
constexpr int kMaxStages = 4;
template <KvLayout L>
constexpr int kStages = L == KvLayout::bf16 ? 4 : 3;
static_assert(kStages<KvLayout::bf16> <= kMaxStages && kStages<KvLayout::fp8_e4m3> <= kMaxStages &&
                  kStages<KvLayout::fp8_ds_mla> <= kMaxStages,
              "barriers and column biases are laid out for kMaxStages");

// A tile of fp8 rows as copied from the pool: 32 records 576 B apart (64 mod 128, so a warp's
// 16-byte reads of 8 rows x 4 lanes spread over all bank groups), then fp8_ds_mla's scale
// bytes, one 8-byte copy per lane. kF16 (an e4m3 cache with an e4m3 query): the scores' wgmma
// read the records where they land, so a raw tile is 128B-swizzled like a stage (four chunks of
// 32 rows x 128 dims) and lives until its scores are done: four buffers (raw_offset).
template <KvLayout L, bool kF16 = false>
struct RawTile {
  static constexpr int kBuffers = L == KvLayout::bf16 ? 0 : kF16 ? 4 : 2;
  static constexpr int kPitch = kDsMlaRecordBytes;
  static constexpr int kScales = kTileColumns * kPitch;  // offset of the scale copies
  static constexpr int kBytes =
      kF16 ? 4 * kKvChunkBytes
           : kScales + (L == KvLayout::fp8_ds_mla ? kTileColumns * 4 * 8 : 0);
};

// Where the seesaw consumer's warpgroups hand over P. Warpgroup h writes its tile's P at [h]
// and its row bases at [h][t]; both hold the same fragment rows, so the partner's thread t reads
// t's. P is either the partner P.V's A operand, unswizzled and K-major (64 rows x 32 columns:
// core matrices of 8 rows x 8 columns, p_lbo apart along the columns, p_sbo along the rows), or
// (SeesawConsumer::kSmemP false) each thread's 8 words at [h][t].
struct SeesawXch {
  static constexpr int p = 0;                        // [writer half] 64 x 32 P, 16-bit
  static constexpr int p_lbo = 128, p_sbo = 4 * p_lbo;
  static constexpr int base = p + 2 * 128 * 32;      // [writer half][128 threads] float2
  static constexpr int finish = base + 2 * 128 * 8;  // [half][128 threads] 2 bases, 2 sums
  static constexpr int bytes = finish + 2 * 128 * 16;
};

struct Smem {  // byte offsets from a 1024-aligned base
  static constexpr int q = 0;                                     // 8 chunks: 64 x 512
  static constexpr int xch = q + 8 * kQChunkBytes;                // exchange, then split combine
  static constexpr int xch_bytes = SeesawXch::bytes;
  static constexpr int combine_bytes =
      (3 * kMaxSplits + 1) * kMmaRows * 4;  // (m, l), weights, factors
  // TopkColumns' staged offsets, past the exchange: the combine overwrites them only after the
  // last tile, whose offsets the producer read before it filled the tile.
  static constexpr int topk = xch + xch_bytes;
  // Each stage's column biases, float [stage][column] (publish_bias; scores_on_landed: per raw
  // buffer).
  static constexpr int bias = xch + (xch_bytes > combine_bytes ? xch_bytes : combine_bytes);
  // full[kStages<L>], then empty[kStages<L>] (room for kMaxStages each), then at 2 kMaxStages
  // the seesaw's P handover (4)
  static constexpr int bars = bias + kMaxStages * kTileColumns * int(sizeof(float));
  static constexpr int flag = bars + (2 * kMaxStages + 4) * 8;
  static constexpr int counts = flag + 16;                        // per producer warp: top-k
  static constexpr int sinks = counts + 4 * 4;                    // [heads]: decode_epilogue
  static constexpr int query_bars = sinks + kMmaRows * 4;         // per consumer: a TMA query
  static constexpr int kv = (query_bars + 2 * 8 + 1023) / 1024 * 1024;  // stages x 8 chunks
  template <KvLayout L>
  static constexpr int raw = kv + kStages<L> * kTileBytes;        // RawTile buffers
  template <KvLayout L>
  static constexpr int end = raw<L> + RawTile<L>::kBuffers * RawTile<L>::kBytes;
};
// Raw buffer i of the tile loop. kF16: buffers 0 and 1 where the others' two go, then that
// region's barriers (raw_bars), buffers 2 and 3 in the upper half of the query's space, which an
// e4m3 query (32 KiB) leaves free.
template <KvLayout L, bool kF16>
__device__ __forceinline__ int raw_offset(int i) {
  constexpr int kBytes = RawTile<L, kF16>::kBytes;
  if constexpr (kF16)
    return i < 2 ? Smem::raw<L> + i * kBytes : Smem::q + 4 * kQChunkBytes + (i - 2) * kBytes;
  else
    return Smem::raw<L> + i * kBytes;
}
// kF16: raw buffer i is free again once its tile's scores are done and masked (128 arrivals:
// the warpgroup that computed them).
template <KvLayout L>
__device__ __forceinline__ uint64_t* raw_bars(uint8_t* smem) {
  return reinterpret_cast<uint64_t*>(smem + Smem::raw<L> + 2 * RawTile<L, true>::kBytes);
}
// kF16 split plans (scores_on_landed): raw buffer i's records have landed and its column
// biases are written (128 copying threads + 32 bias writers).
template <KvLayout L>
__device__ __forceinline__ uint64_t* raw_full(uint8_t* smem) {
  return raw_bars<L>(smem) + RawTile<L, true>::kBuffers;
}
static_assert(2 * RawTile<KvLayout::fp8_e4m3, true>::kBytes + 8 * 8 <=
                  RawTile<KvLayout::fp8_e4m3>::kBuffers * RawTile<KvLayout::fp8_e4m3>::kBytes,
              "kF16's first two raw buffers and their barriers fit in the raw region");
static_assert(4 * kQChunkBytes + 2 * RawTile<KvLayout::fp8_e4m3, true>::kBytes == Smem::xch,
              "kF16's last two raw buffers fill the query's upper half");
// kF16 split plans: a tile's scores start once its records land in their raw buffer (raw_full,
// column biases per raw buffer), its P.V once its stage is converted: split plans' CTAs have
// few tiles, and the conversion was on their critical path (2 x 2 H=64 -2.6%); unsplit plans
// measured 2-5% slower so (docs/kernel.md). Both sides compile the two ways apart.
template <bool kF16, bool kQueryTma>
__device__ __forceinline__ bool scores_on_landed(const DecodeParams& p) {
  return kF16 && !kQueryTma && p.num_splits > 1;
}
static_assert(RawTile<KvLayout::fp8_e4m3, true>::kBuffers <= kMaxStages,
              "kF16's column biases are laid out per raw buffer");
static_assert(Smem::xch_bytes + kMaxTopk * 4 <= Smem::combine_bytes,
              "the staged top-k offsets fit where the combine goes");
// The epilogue stages bf16 O rows from Smem::kv on (decode_epilogue.cuh); the pad spreads a
// warp's fragment stores over the banks.
constexpr int kRowChunks = 512 * 2 / 16;        // 16-byte chunks of a bf16 output row
constexpr int kOutPitch = kRowChunks * 16 + 16;  // bytes per staged output row
constexpr int kOutBytes = kMmaRows * kOutPitch;

// Named barriers (0 is __syncthreads): the consumer warpgroups once their query landed; before
// their final (base, sum) exchange; in the epilogue; and the producer meeting their staged
// top-k offsets (all 384 threads).
enum NamedBarrier : uint32_t {
  kQueryBarrier = 1,
  kFinishBarrier = 2,
  kEpilogueBarrier = 5,
  kTopkBarrier = 6,
};
template <KvLayout L>
constexpr int kSmemBytes =
    (Smem::end<L> > Smem::kv + kOutBytes ? Smem::end<L> : Smem::kv + kOutBytes) +
    1024;  // slack to align the base
static_assert(kSmemBytes<KvLayout::bf16> <= 227 * 1024 &&
                  kSmemBytes<KvLayout::fp8_e4m3> <= 227 * 1024 &&
                  kSmemBytes<KvLayout::fp8_ds_mla> <= 227 * 1024,
              "shared memory per CTA");

// Byte offset of 16-byte unit `unit` (0..7) of row `row` inside a 128B-swizzled chunk.
__device__ __forceinline__ uint32_t swizzle(int row, int unit) {
  return row * 128 + ((unit ^ (row & 7)) << 4);
}

struct Work {
  int token, request, pos, head_block, split, head0, live_heads;
  int swa_len, topk_len;
  int tile_begin, tile_end;

  // The row's length (columns past it are not attended) and so this CTA's tiles.
  __device__ __forceinline__ void set_length(const DecodeParams& p, int len) {
    topk_len = max(0, min(len, p.num_columns));
    const int tiles = (topk_len + kTileColumns - 1) / kTileColumns;
    tile_begin = min(tiles, split * p.tiles_per_split);
    tile_end = min(tiles, tile_begin + p.tiles_per_split);
  }
};

// With TopkColumns, the row's compressed length as its table build writes it (SPEC §4), given
// `count`, the token's top-k entries >= 0.
__device__ __forceinline__ int compressed_length(const DecodeParams& p, const Work& w,
                                                 int count) {
  const TopkParams& k = p.topk;
  if (k.is_valid && !k.is_valid[int64_t(w.token) * k.valid_stride]) return 0;
  if (w.request < k.num_decodes) return count;
  return int(rules::topk_used(false, w.pos, k.compress_ratio, k.top_k));
}

// CTA index = (token, head block, split), splits fastest: a split row's CTAs are consecutive,
// so they form one cluster when the row is reduced in its cluster (rank = split).
__device__ __forceinline__ int cta_split(const DecodeParams& p) {
  return blockIdx.x % p.num_splits;
}
__device__ __forceinline__ int cta_head_block(const DecodeParams& p) {
  return blockIdx.x / p.num_splits % p.head_blocks;
}
__device__ __forceinline__ int cta_token(const DecodeParams& p) {
  return blockIdx.x / (p.num_splits * p.head_blocks);
}

// The token's request is how many requests end at or before it (cum_seq_lens_q nondecreasing),
// found by the warp in max(1, ceil(log32 B)) memory round trips: while more than 32 requests
// remain, lane l reads the end of the (l+1)-th of 32 equal slices and the ballot keeps one
// slice; then lane l reads request lo + l's start, end and length, the token's coming by
// shuffle. A scan of B / 32 loads a lane cost bf16 H=128 256 x 2 5.4%, 512 x 1 8.5%
// (seventy-eighth session). A token past cum[B] (device offsets are unchecked) finds request B,
// whose lane holds no request (or, 32 left, lane 0's): no read past the views; stage_topk
// clamps it.
__device__ __forceinline__ Work locate_work(const DecodeParams& p) {
  Work w;
  w.split = cta_split(p);
  w.head_block = cta_head_block(p);
  w.token = cta_token(p);
  w.head0 = w.head_block * p.heads_per_cta;
  w.live_heads = min(p.heads_per_cta, p.num_heads - w.head0);
  int request = w.token, first = w.token, q_len = 1, seq_len;
  if (p.cum_seq_lens_q) {
    const int lane = threadIdx.x % 32;
    const int64_t requests = p.num_requests;
    int64_t lo = 0, hi = requests;  // the token's request is in [lo, hi] (B: past the last)
    // Until requests lo .. min(hi, B - 1) fit the lanes: which of 32 equal slices holds it.
    while (min(hi + 1, requests) - lo > 32) {
      const int64_t step = (hi - lo + 31) / 32, probe = lo + (lane + 1) * step - 1;
      const bool ended = probe < hi && __ldg(p.cum_seq_lens_q + probe + 1) <= w.token;
      const int slices = __popc(__ballot_sync(~0u, ended));
      hi = min(hi, lo + (slices + 1) * step - 1);  // the first probe not ended, if any
      lo += slices * step;
    }
    const int64_t b = lo + lane;
    const bool in = b < min(hi + 1, requests);
    const int end = in ? __ldg(p.cum_seq_lens_q + b + 1) : INT_MAX;
    const int start = in ? __ldg(p.cum_seq_lens_q + b) : 0;
    const int len = in ? __ldg(p.seq_lens + b) : 0;
    const int k = __popc(__ballot_sync(~0u, end <= w.token));
    request = static_cast<int>(lo) + k;
    first = __shfl_sync(~0u, start, k);
    q_len = __shfl_sync(~0u, end, k) - first;
    seq_len = __shfl_sync(~0u, len, k);
  } else {
    seq_len = __ldg(p.seq_lens + request);
  }
  w.request = request;
  w.pos = seq_len - q_len + (w.token - first);
  w.swa_len = max(0, min(w.pos + 1, p.window));
  if (!p.topk.indices) w.topk_len = __ldg(p.sparse_topk_lens + w.token);  // see set_length
  return w;
}

}  // namespace smla::cuda
