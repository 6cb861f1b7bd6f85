// The sm_90a sparse MLA decode kernel (bf16 KV). One CTA = up to 64 heads of one token x one
// slice of its columns. Warpgroup 0 gathers KV rows with cp.async into 128B-swizzled shared
// memory, kStages tiles ahead; warpgroups 1 and 2 each own 256 of the 512 dims: they compute
// partial scores over their half with wgmma, exchange them through shared memory, run the same
// online softmax, and accumulate P.V for their half of the output. Splits of a row are reduced
// in the same launch by the last CTA to arrive (SPEC §3).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decode_params.h"
#include "cuda/decode_plan.h"
#include "cuda/ptx.cuh"

namespace smla::cuda {

constexpr int kStages = 4;
constexpr int kThreads = 384;                       // producer + 2 consumer warpgroups
constexpr int kQChunkBytes = kMmaRows * 128;        // 64 heads x 64 dims, bf16, swizzled
constexpr int kKvChunkBytes = kTileColumns * 128;   // 32 rows x 64 dims
constexpr int kScores = kTileColumns / 2;           // score registers per consumer thread
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Smem {  // byte offsets from a 1024-aligned base
  static constexpr int q = 0;                                     // 8 chunks: 64 x 512
  static constexpr int kv = q + 8 * kQChunkBytes;                 // kStages x 8 chunks
  static constexpr int xch = kv + kStages * 8 * kKvChunkBytes;    // 2 x 128 threads x kScores f32
  static constexpr int xch_bytes = 2 * 128 * kScores * 4;
  static constexpr int combine_bytes = (3 * kMaxSplits + 1) * kMmaRows * 4;  // (m, l), weights, factors
  static constexpr int mask = xch + (xch_bytes > combine_bytes ? xch_bytes : combine_bytes);
  static constexpr int bars = mask + kStages * kTileColumns;      // full[kStages], empty[kStages]
  static constexpr int flag = bars + 2 * kStages * 8;
  static constexpr int end = flag + 16;
};
constexpr int kSmemBytes = Smem::end + 1024;  // slack to align the base
static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");

// Byte offset of 16-byte unit `unit` (0..7) of row `row` inside a 128B-swizzled chunk.
__device__ __forceinline__ uint32_t swizzle(int row, int unit) {
  return row * 128 + ((unit ^ (row & 7)) << 4);
}

struct Work {
  int token, head_block, split, head0, live_heads;
  int swa_len, topk_len;
  int tile_begin, tile_end;
};

__device__ __forceinline__ Work locate_work(const DecodeParams& p) {
  Work w;
  const int cta = blockIdx.x;
  w.head_block = cta % p.head_blocks;
  w.split = (cta / p.head_blocks) % p.num_splits;
  w.token = cta / (p.head_blocks * p.num_splits);
  w.head0 = w.head_block * p.heads_per_cta;
  w.live_heads = min(p.heads_per_cta, p.num_heads - w.head0);
  int request = w.token, first = w.token, q_len = 1;
  if (p.cum_seq_lens_q) {  // the token's request = how many requests end at or before it
    int ended = 0;
    for (int b = threadIdx.x % 32; b < p.num_requests; b += 32)
      ended += __ldg(p.cum_seq_lens_q + b + 1) <= w.token;
    for (int d = 16; d > 0; d /= 2) ended += __shfl_xor_sync(~0u, ended, d);
    request = ended;
    first = __ldg(p.cum_seq_lens_q + request);
    q_len = __ldg(p.cum_seq_lens_q + request + 1) - first;
  }
  const int pos = __ldg(p.seq_lens + request) - q_len + (w.token - first);
  w.swa_len = max(0, min(pos + 1, p.window));
  w.topk_len = max(0, min(__ldg(p.sparse_topk_lens + w.token), p.num_columns));
  const int tiles = (w.topk_len + kTileColumns - 1) / kTileColumns;
  w.tile_begin = min(tiles, w.split * p.tiles_per_split);
  w.tile_end = min(tiles, w.tile_begin + p.tiles_per_split);
  return w;
}

// ---- producer: gather one tile of KV rows per stage -------------------------------------------
// Four lanes copy one 1 KiB row (each 16 of its 64 16-byte units); columns that are not
// attended (SPEC §2 rules 1-3) become zero rows that are never read from memory.
// The producer lane's KV row within a tile, and the index of its column in `tile` (no
// dependence on the row's metadata, so the first ones load while that is still in flight).
__device__ __forceinline__ int producer_row() { return (threadIdx.x / 32) % 4 * 8 + threadIdx.x % 32 / 4; }
__device__ __forceinline__ int32_t load_index(const DecodeParams& p, int token, int tile) {
  const int col = tile * kTileColumns + producer_row();
  return col < p.num_columns ? __ldg(p.sparse_indices + int64_t(token) * p.indices_stride + col) : -1;
}

__device__ __forceinline__ void produce(const DecodeParams& p, const Work& w, uint8_t* smem,
                                        int32_t offset_next, int32_t offset_after) {
  const int lane = threadIdx.x % 32;
  const int row = producer_row(), part = lane % 4;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  uint64_t* empty = full + kStages;
  int n = 0;
  for (int tile = w.tile_begin; tile < w.tile_end; ++tile, ++n) {  // indices two tiles ahead
    const int32_t offset = offset_next;
    offset_next = offset_after;
    offset_after = tile + 2 < w.tile_end ? load_index(p, w.token, tile + 2) : -1;
    const int stage = n % kStages;
    if (n >= kStages) ptx::mbar_wait(&empty[stage], ((n / kStages) - 1) & 1);
    const int col = tile * kTileColumns + row;
    const bool swa = col < p.window;
    const uint32_t rows = swa ? p.swa.rows : p.compressed.rows;
    const uint32_t span = swa ? p.swa.span : p.compressed.span;
    const uint32_t block_size = swa ? p.swa.block_size : p.compressed.block_size;
    const bool valid = col < w.topk_len && (!swa || col < w.swa_len) && offset >= 0 &&
                       uint32_t(offset) < rows && uint32_t(offset) % span < block_size;
    const char* src = swa ? p.swa.base : p.compressed.base;
    if (valid)
      src += int64_t(uint32_t(offset) / span) *
                 (swa ? p.swa.block_stride_bytes : p.compressed.block_stride_bytes) +
             int64_t(uint32_t(offset) % span) *
                 (swa ? p.swa.token_stride_bytes : p.compressed.token_stride_bytes);
    const uint32_t dst = ptx::smem_addr(smem + Smem::kv + stage * 8 * kKvChunkBytes);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int unit = part + 4 * k;  // 16-byte unit of the row
      ptx::cp_async_16(dst + (unit / 8) * kKvChunkBytes + swizzle(row, unit % 8), src + unit * 16, valid);
    }
    ptx::cp_async_arrive(&full[stage]);  // when this thread's copies land
    if (part == 0) {                     // column flags: released by a plain arrive
      smem[Smem::mask + stage * kTileColumns + row] = valid;
      ptx::mbar_arrive(&full[stage]);
    }
  }
}

// ---- epilogue helpers -----------------------------------------------------------------------
// Output = factor * o for a row with running max `m` (log2 units) and sum `l`; writes lse.
__device__ __forceinline__ float finish_row(const DecodeParams& p, int token, int head, float m,
                                            float l, bool write_lse) {
  if (write_lse && p.lse)
    p.lse[token * p.lse_token_stride + head * p.lse_head_stride] =
        m == -INFINITY ? -INFINITY : (m + __log2f(l)) * kLn2;
  const float sink = p.sinks ? __ldg(p.sinks + head) * kLog2e : -INFINITY;
  const float top = fmaxf(m, sink);
  if (m == -INFINITY || top == INFINITY) return 0.f;  // no attended column, or a +inf sink
  const float w = exp2f(m - top);
  return p.bmm2_scale * w / (l * w + exp2f(sink - top));
}

__device__ __forceinline__ __nv_bfloat16* out_row(const DecodeParams& p, int token, int head) {
  return static_cast<__nv_bfloat16*>(p.out) + token * p.out_token_stride + head * p.out_head_stride;
}

// Heads past the last head block (up to H_out) are zeros; written once per token.
__device__ __forceinline__ void zero_tail_heads(const DecodeParams& p, int token, int thread) {
  const int first = p.head_blocks * p.heads_per_cta;
  for (int i = thread; i < (p.out_heads - first) * 64; i += 256) {
    const int head = first + i / 64, unit = i % 64;
    reinterpret_cast<uint4*>(out_row(p, token, head))[unit] = make_uint4(0, 0, 0, 0);
  }
}

// ---- consumers: scores, online softmax, P.V -------------------------------------------------
// The running max moves only when a tile's max exceeds it by this much (log2 units): until then
// P <= 2^8 stays exact enough in bf16 and the 128-register rescale of O is skipped.
constexpr float kRescaleThreshold = 8.f;

struct Consumer {
  int half, tid, warp, lane;
  uint64_t q_desc, k_desc, v_desc;  // descriptors of this warpgroup's Q half, K and V of stage 0
  uint64_t *full, *empty;
  float4 *xch_mine;
  const float4* xch_other;
  const uint8_t* mask;
  float o[128];
  float row_max[2], row_sum[2];

  // Issues the partial scores of the tile in `stage` (this warpgroup's 256 dims).
  __device__ __forceinline__ void issue_scores(float (&s)[kScores], int stage) {
    const uint64_t k_stage = k_desc + ptx::desc_offset(stage * 8 * kKvChunkBytes);
    ptx::fence_operands(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const uint64_t a = q_desc + ptx::desc_offset((k / 4) * kQChunkBytes + (k % 4) * 32);
      const uint64_t b = k_stage + ptx::desc_offset((k / 4) * kKvChunkBytes + (k % 4) * 32);
      ptx::wgmma_m64n32k16_ss(s, a, b, k > 0);
    }
    ptx::wgmma_commit();
  }

  // Tile n: its scores are in `s`; ends with P.V of n and the scores of n+1 (into `next`) queued.
  __device__ __forceinline__ void step(int n, int tiles, float (&s)[kScores], float (&next)[kScores],
                                       const DecodeParams& p) {
    const int stage = n % kStages;
    ptx::wgmma_wait<0>();  // scores of n, and P.V of n-1
    ptx::fence_operands(s);
    ptx::fence_operands(o);
    if (n > 0) ptx::mbar_arrive(&empty[(n - 1) % kStages]);

    // Full scores = both halves' partials; a + b == b + a, so both warpgroups agree bitwise.
    if (n > 0) ptx::named_sync(3, 256);  // the partner has read my previous partial
#pragma unroll
    for (int i = 0; i < kScores / 4; ++i)
      xch_mine[i * 128 + tid] = make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]);
    ptx::named_sync(4, 256);
#pragma unroll
    for (int i = 0; i < kScores / 4; ++i) {
      const float4 v = xch_other[i * 128 + tid];
      s[4 * i] += v.x, s[4 * i + 1] += v.y, s[4 * i + 2] += v.z, s[4 * i + 3] += v.w;
    }

    // Online softmax in log2 units; masked columns are -inf (their rows were zero-filled).
    const uint8_t* flags = mask + stage * kTileColumns;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kScores / 4; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      const bool v0 = flags[col], v1 = flags[col + 1];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * j + 2 * r] = v0 ? s[4 * j + 2 * r] * p.scale_log2 : -INFINITY;
        s[4 * j + 2 * r + 1] = v1 ? s[4 * j + 2 * r + 1] * p.scale_log2 : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      }
    }
    float base[2], alpha[2] = {1.f, 1.f};
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(~0u, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(~0u, tile_max[r], 2));
      if (tile_max[r] > row_max[r] + kRescaleThreshold) {  // also the first attended tile
        alpha[r] = exp2f(row_max[r] - tile_max[r]);
        row_max[r] = tile_max[r];
        row_sum[r] *= alpha[r];
        rescale = true;
      }
      base[r] = row_max[r] == -INFINITY ? 0.f : row_max[r];
    }
    uint32_t pa[kTileColumns / 16][4];  // P as the bf16 A operand of the k16 steps
#pragma unroll
    for (int j = 0; j < kScores / 4; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float p0 = exp2f(s[4 * j + 2 * r] - base[r]);
        const float p1 = exp2f(s[4 * j + 2 * r + 1] - base[r]);
        row_sum[r] += p0 + p1;
        __nv_bfloat162 packed = __floats2bfloat162_rn(p0, p1);
        pa[j / 2][(j % 2) * 2 + r] = *reinterpret_cast<uint32_t*>(&packed);
      }
    }
    if (__any_sync(~0u, rescale)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }

    const uint64_t v_stage = v_desc + ptx::desc_offset(stage * 8 * kKvChunkBytes);
    ptx::fence_operands(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kTileColumns / 16; ++k)
      ptx::wgmma_m64n256k16_rs(o, pa[k], v_stage + ptx::desc_offset(k * 16 * 128));
    ptx::wgmma_commit();
    // The scores of tile n+1 queue behind P.V on the tensor cores. (Issuing them before the
    // softmax would overlap more, but ptxas then serializes every wgmma: C7515.)
    if (n + 1 < tiles) {
      ptx::mbar_wait(&full[(n + 1) % kStages], ((n + 1) / kStages) & 1);
      ptx::fence_proxy_async();
      issue_scores(next, (n + 1) % kStages);
    }

  }
};

// Output rows are staged as bf16 in the idle KV buffers, then written in 16-byte chunks.
constexpr int kStagePitch = 1024 + 16;  // bytes per staged row; the pad spreads banks

// Stages output columns (col, col + 1) of `row` (< heads_per_cta) from two f32 values.
__device__ __forceinline__ void stage_pair(uint8_t* smem, int row, int col, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(smem + Smem::kv + row * kStagePitch + col * 2) =
      __floats2bfloat162_rn(a, b);
}

__device__ __forceinline__ void write_staged(const DecodeParams& p, const Work& w, uint8_t* smem,
                                             int thread) {
  ptx::named_sync(5, 256);
  for (int i = thread; i < p.heads_per_cta * 64; i += 256) {
    const int row = i / 64, unit = i % 64, head = w.head0 + row;
    if (head < p.out_heads)
      reinterpret_cast<uint4*>(out_row(p, w.token, head))[unit] =
          *reinterpret_cast<const uint4*>(smem + Smem::kv + row * kStagePitch + unit * 16);
  }
  if (w.head_block == p.head_blocks - 1) zero_tail_heads(p, w.token, thread);
}

// A row's fragment `o` element i sits at row (i >> 1) & 1 (+8) and column 8 (i / 4) + 2 (lane % 4)
// + (i & 1) of this warpgroup's half.
__device__ __forceinline__ void store_output(const DecodeParams& p, const Work& w, const Consumer& c,
                                             uint8_t* smem, int thread) {
  // The stage overlays the KV tiles: the other warpgroup's last P.V may still read them.
  ptx::named_sync(5, 256);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.warp * 16 + c.lane / 4 + 8 * r;
    if (row >= p.heads_per_cta) continue;
    const float factor = row < w.live_heads
        ? finish_row(p, w.token, w.head0 + row, c.row_max[r], c.row_sum[r], c.half == 0 && c.lane % 4 == 0)
        : 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      stage_pair(smem, row, c.half * 256 + 8 * j + 2 * (c.lane % 4), c.o[4 * j + 2 * r] * factor,
                 c.o[4 * j + 2 * r + 1] * factor);
  }
  write_staged(p, w, smem, thread);
}

// The last CTA of a split row sums every split's partial in split order (deterministic), each
// thread a quarter, half or whole row slice of kHeads rows, into the output stage.
template <int kHeads>
__device__ __forceinline__ void combine_rows(const DecodeParams& p, const float* row_partials,
                                             const float* weights, const float* factors,
                                             uint8_t* smem, int thread) {
  constexpr int kThreadsPerRow = 256 / kHeads, kVectors = 128 / kThreadsPerRow;
  const int row = thread / kThreadsPerRow, part = thread % kThreadsPerRow;
  const int64_t stride = partial_floats(kHeads);
  float4 acc[kVectors];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < p.num_splits; ++s) {
    const float4* o = reinterpret_cast<const float4*>(row_partials + s * stride + row * 512) + part;
    float4 v[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) v[k] = __ldcg(o + k * kThreadsPerRow);
    const float wgt = weights[s * kHeads + row];
#pragma unroll
    for (int k = 0; k < kVectors; ++k)
      acc[k].x += wgt * v[k].x, acc[k].y += wgt * v[k].y, acc[k].z += wgt * v[k].z, acc[k].w += wgt * v[k].w;
  }
  const float factor = factors[row];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int col = 4 * (part + k * kThreadsPerRow);
    stage_pair(smem, row, col, acc[k].x * factor, acc[k].y * factor);
    stage_pair(smem, row, col + 2, acc[k].z * factor, acc[k].w * factor);
  }
}

// Split row: publishes this CTA's partial (unnormalized O rows, then (max, sum) per row) and
// counts the arrival. The last CTA to arrive returns the counter to zero, combines the splits
// and writes the output; the others return at once.
__device__ __forceinline__ void finish_split(const DecodeParams& p, const Work& w, const Consumer& c,
                                             uint8_t* smem, int thread) {
  const int heads = p.heads_per_cta;
  const int64_t stride = partial_floats(heads);
  float* row_partials =
      p.partials + (int64_t(w.token) * p.head_blocks + w.head_block) * p.num_splits * stride;
  float* mine = row_partials + w.split * stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.warp * 16 + c.lane / 4 + 8 * r;
    if (row >= heads) continue;
    float2* dst = reinterpret_cast<float2*>(mine + row * 512 + c.half * 256 + (c.lane % 4) * 2);
#pragma unroll
    for (int j = 0; j < 32; ++j) __stcg(dst + j * 4, make_float2(c.o[4 * j + 2 * r], c.o[4 * j + 2 * r + 1]));
    if (c.half == 0 && c.lane % 4 == 0)
      __stcg(reinterpret_cast<float2*>(mine + heads * 512) + row, make_float2(c.row_max[r], c.row_sum[r]));
  }
  __threadfence();
  ptx::named_sync(5, 256);
  int32_t* counter = p.counters + int64_t(w.token) * p.head_blocks + w.head_block;
  int* is_last = reinterpret_cast<int*>(smem + Smem::flag);
  if (thread == 0) *is_last = atomicAdd(counter, 1) == p.num_splits - 1;
  ptx::named_sync(5, 256);
  if (!*is_last) return;
  __threadfence();
  if (thread == 0) *counter = 0;  // back to zero for the next launch (SPEC §3)

  // Per row: the max over splits, each split's weight, the sum, and the output factor.
  float2* ml = reinterpret_cast<float2*>(smem + Smem::xch);              // [split][row]
  float* weights = reinterpret_cast<float*>(ml + kMaxSplits * kMmaRows);  // [split][row]
  float* factors = weights + kMaxSplits * kMmaRows;                       // [row]
  for (int i = thread; i < p.num_splits * heads; i += 256)
    ml[i] = __ldcg(reinterpret_cast<const float2*>(row_partials + (i / heads) * stride + heads * 512) + i % heads);
  ptx::named_sync(5, 256);
  if (thread < heads) {
    float m = -INFINITY, l = 0.f;
    for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, ml[s * heads + thread].x);
    const float base = m == -INFINITY ? 0.f : m;
    for (int s = 0; s < p.num_splits; ++s) {
      const float weight = exp2f(ml[s * heads + thread].x - base);
      l += weight * ml[s * heads + thread].y;
      weights[s * heads + thread] = weight;
    }
    factors[thread] = thread < w.live_heads ? finish_row(p, w.token, w.head0 + thread, m, l, true) : 0.f;
  }
  ptx::named_sync(5, 256);
  switch (heads) {
    case 16: combine_rows<16>(p, row_partials, weights, factors, smem, thread); break;
    case 32: combine_rows<32>(p, row_partials, weights, factors, smem, thread); break;
    default: combine_rows<64>(p, row_partials, weights, factors, smem, thread); break;
  }
  write_staged(p, w, smem, thread);
}

__device__ __forceinline__ void consume(const DecodeParams& p, const Work& w, uint8_t* smem) {
  Consumer c;
  c.half = threadIdx.x / 128 - 1;  // which 256 dims this warpgroup owns
  c.tid = threadIdx.x % 128, c.warp = c.tid / 32, c.lane = c.tid % 32;
  uint8_t* q_half = smem + Smem::q + c.half * 4 * kQChunkBytes;
  const uint32_t kv_half = ptx::smem_addr(smem + Smem::kv) + c.half * 4 * kKvChunkBytes;
  c.q_desc = ptx::sw128_desc(ptx::smem_addr(q_half), 16, 1024);
  c.k_desc = ptx::sw128_desc(kv_half, 16, 1024);
  c.v_desc = ptx::sw128_desc(kv_half, kKvChunkBytes, 1024);
  c.full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  c.empty = c.full + kStages;
  c.xch_mine = reinterpret_cast<float4*>(smem + Smem::xch) + c.half * 128 * (kScores / 4);
  c.xch_other = reinterpret_cast<const float4*>(smem + Smem::xch) + (1 - c.half) * 128 * (kScores / 4);
  c.mask = smem + Smem::mask;

  // Query half: 64 rows x 256 dims; rows past the live heads are zeros (no padded copy).
  for (int i = c.tid; i < kMmaRows * 32; i += 128) {
    const int row = i / 32, unit = i % 32;
    const bool live = row < w.live_heads;
    const char* src = static_cast<const char*>(p.query);
    if (live)
      src += (int64_t(w.token) * p.q_token_stride + int64_t(w.head0 + row) * p.q_head_stride +
              c.half * 256 + unit * 8) * 2;
    ptx::cp_async_16(ptx::smem_addr(q_half + (unit / 8) * kQChunkBytes + swizzle(row, unit % 8)),
                     src, live);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  ptx::fence_proxy_async();
  ptx::named_sync(1 + c.half, 128);

#pragma unroll
  for (int i = 0; i < 128; ++i) c.o[i] = 0.f;
  c.row_max[0] = c.row_max[1] = -INFINITY;
  c.row_sum[0] = c.row_sum[1] = 0.f;
  ptx::fence_operands(c.o);  // keep the zeroing out of any wgmma's flight
  const int tiles = w.tile_end - w.tile_begin;
  float s0[kScores], s1[kScores];
  if (tiles > 0) {
    ptx::mbar_wait(&c.full[0], 0);
    ptx::fence_proxy_async();
    c.issue_scores(s0, 0);
  }
  for (int n = 0; n < tiles; n += 2) {  // unrolled by two so the score buffers stay in registers
    c.step(n, tiles, s0, s1, p);
    if (n + 1 < tiles) c.step(n + 1, tiles, s1, s0, p);
  }
  ptx::wgmma_wait<0>();
  ptx::fence_operands(c.o);
  if (tiles > 0) ptx::mbar_arrive(&c.empty[(tiles - 1) % kStages]);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    c.row_sum[r] += __shfl_xor_sync(~0u, c.row_sum[r], 1);
    c.row_sum[r] += __shfl_xor_sync(~0u, c.row_sum[r], 2);
  }
  const int thread = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  if (p.num_splits > 1)
    finish_split(p, w, c, smem, thread);
  else
    store_output(p, w, c, smem, thread);
}
__global__ void __launch_bounds__(kThreads, 1) decode_bf16_kernel(const __grid_constant__ DecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  // Offsetting the __shared__ array (not an integer cast) keeps shared-memory instructions.
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  // The producer's first two indices load alongside the row's metadata.
  const int first_tile = blockIdx.x / p.head_blocks % p.num_splits * p.tiles_per_split;
  const int token = blockIdx.x / (p.head_blocks * p.num_splits);
  int32_t first_offsets[2] = {-1, -1};
  if (threadIdx.x < 128)
    for (int k = 0; k < 2; ++k) first_offsets[k] = load_index(p, token, first_tile + k);
  const Work w = locate_work(p);
  if (threadIdx.x == 0) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Smem::bars);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&bars[s], 128 + 32);       // full: copies of 128 threads + 32 flag writers
      ptx::mbar_init(&bars[kStages + s], 256);  // empty: every consumer thread
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::reg_dealloc<40>();
    produce(p, w, smem, first_offsets[0], first_offsets[1]);
  } else {
    ptx::reg_alloc<232>();
    consume(p, w, smem);
  }
}

}  // namespace smla::cuda
