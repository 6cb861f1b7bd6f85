// The decode kernel's consumer warpgroups: scores, online softmax and P.V for one tile.
#pragma once
#include "cuda/decode_layout.cuh"

namespace smla::cuda {

// The running max moves only when a tile's max exceeds it by this much (log2 units): until then
// P <= 2^8 stays exact enough in bf16 and the 128-register rescale of O is skipped.
constexpr float kRescaleThreshold = 8.f;

template <int kStages>
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
    const uint64_t k_stage = k_desc + ptx::desc_offset(stage * kTileBytes);
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
  __device__ __forceinline__ void step(int n, int tiles, float (&s)[kScores],
                                       float (&next)[kScores], const DecodeParams& p) {
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
        const float p0 = ptx::exp2_approx(s[4 * j + 2 * r] - base[r]);
        const float p1 = ptx::exp2_approx(s[4 * j + 2 * r + 1] - base[r]);
        row_sum[r] += p0 + p1;
        __nv_bfloat162 packed = __floats2bfloat162_rn(p0, p1);
        pa[j / 2][(j % 2) * 2 + r] = *reinterpret_cast<uint32_t*>(&packed);
      }
    }
    if (__any_sync(~0u, rescale)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }

    const uint64_t v_stage = v_desc + ptx::desc_offset(stage * kTileBytes);
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

}  // namespace smla::cuda
