// The lockstep consumer (bf16 split plans): warpgroups 1 and 2 each own 256 of the 512 dims. For
// every tile each computes partial scores over its half and they exchange them; each runs the
// online softmax of half the rows and hands its P to the other; both accumulate P.V for their
// half of the output. The stages are released as soon as both P.V are done, which keeps the
// most bf16 rows in flight (docs/kernel.md).
#pragma once
#include "cuda/decode_consumer.cuh"

namespace smla::cuda {

template <int kStages, bool kF16>
struct LockstepConsumer : ConsumerCore<kStages, kF16, false> {
  using Core = ConsumerCore<kStages, kF16, false>;
  using Core::empty, Core::full, Core::half, Core::lane, Core::bias, Core::o, Core::pack,
      Core::row_max, Core::row_sum, Core::tid, Core::warp, Core::xch;

  static __device__ __forceinline__ void init_barriers(uint64_t*) {}

  // The CTA row (head - head0) of fragment row r; in the loop only row 0's max and sum are kept.
  __device__ __forceinline__ int row_of(int r) const {
    return warp * 16 + lane / 4 + 8 * (r ^ half);
  }

  __device__ __forceinline__ void run(int tiles, const DecodeParams& p) {
    float s0[kScores], s1[kScores];
    if (tiles > 0) {
      ptx::mbar_wait(&full[0], 0);
      ptx::fence_proxy_async();
      this->issue_scores(s0, 0);
    }
    for (int n = 0; n < tiles; n += 2) {  // unrolled by two so the score buffers stay in registers
      step(n, tiles, s0, s1, p);
      if (n + 1 < tiles) step(n + 1, tiles, s1, s0, p);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operands(o);
    if (tiles > 0) ptx::mbar_arrive(&empty[(tiles - 1) % kStages]);
  }

  // Tile n: its scores are in `s`; ends with P.V of n and the scores of n+1 (into `next`) queued.
  // Score fragment element 4j + 2r + e is row r, column 8j + 2 (lane % 4) + e.
  __device__ __forceinline__ void step(int n, int tiles, float (&s)[kScores],
                                       float (&next)[kScores], const DecodeParams& p) {
    const int stage = n % kStages;
    ptx::wgmma_wait<0>();  // scores of n, and P.V of n-1
    ptx::fence_operands(s);
    ptx::fence_operands(o);
    if (n > 0) ptx::mbar_arrive(&empty[(n - 1) % kStages]);

    // Partial scores of the partner's row out, of mine in. Each exchange buffer is rewritten
    // only after the other exchange's barrier, which the partner reaches after reading it.
    float4* partials = reinterpret_cast<float4*>(xch + LockstepXch::partials) + tid;
    partials[half * 256] = make_float4(s[2], s[3], s[6], s[7]);
    partials[half * 256 + 128] = make_float4(s[10], s[11], s[14], s[15]);
    ptx::named_sync(3, 256);
    const float4 in0 = partials[(1 - half) * 256], in1 = partials[(1 - half) * 256 + 128];
    const float theirs[8] = {in0.x, in0.y, in0.z, in0.w, in1.x, in1.y, in1.z, in1.w};

    // Online softmax of my row in log2 units; masked columns are -inf (their rows are zeros).
    const float* b_col = bias + stage * kTileColumns + 2 * (lane % 4);
    float x[8], tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 b = *reinterpret_cast<const float2*>(b_col + 8 * j);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float full_score = s[4 * j + e] + theirs[2 * j + e];
        x[2 * j + e] = fmaf(full_score, p.scale_log2, e ? b.y : b.x);
        tile_max = fmaxf(tile_max, x[2 * j + e]);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, 2));
    float alpha[2] = {1.f, 1.f};
    if (tile_max > row_max[0] + kRescaleThreshold) {  // also the first attended tile
      alpha[0] = exp2f(row_max[0] - tile_max);
      row_max[0] = tile_max;
      row_sum[0] *= alpha[0];
    }
    const float base = row_max[0] == -INFINITY ? 0.f : row_max[0];
    uint32_t my_p[4];  // P of my row, columns 8j + 2 (lane % 4) + {0, 1}
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = ptx::exp2_approx(x[2 * j] - base);
      const float p1 = ptx::exp2_approx(x[2 * j + 1] - base);
      row_sum[0] += p0 + p1;
      my_p[j] = pack(p0, p1);
    }
    uint4* p_slots = reinterpret_cast<uint4*>(xch + LockstepXch::p);
    float* alphas = reinterpret_cast<float*>(xch + LockstepXch::alpha);
    const int mine = half * 128 + tid, partner = (1 - half) * 128 + tid;
    p_slots[mine] = make_uint4(my_p[0], my_p[1], my_p[2], my_p[3]);
    alphas[mine] = alpha[0];
    ptx::named_sync(4, 256);
    const uint4 got = p_slots[partner];
    alpha[1] = alphas[partner];
    const uint32_t theirs_p[4] = {got.x, got.y, got.z, got.w};
    uint32_t pa[kTileColumns / 16][4];  // P as the bf16 A operand of the k16 steps
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pa[j / 2][(j % 2) * 2] = my_p[j];
      pa[j / 2][(j % 2) * 2 + 1] = theirs_p[j];
    }
    this->rescale_o(alpha);
    this->issue_pv(pa, stage);
    // The scores of tile n+1 queue behind P.V on the tensor cores. (Issuing them before the
    // softmax would overlap more, but ptxas then serializes every wgmma: C7515.)
    if (n + 1 < tiles) {
      ptx::mbar_wait(&full[(n + 1) % kStages], ((n + 1) / kStages) & 1);
      ptx::fence_proxy_async();
      this->issue_scores(next, (n + 1) % kStages);
    }
  }

  // After the last tile: my row's sum over its quad, then the partner's row's (max, sum).
  __device__ __forceinline__ void finish_rows() {
    row_sum[0] += __shfl_xor_sync(~0u, row_sum[0], 1);
    row_sum[0] += __shfl_xor_sync(~0u, row_sum[0], 2);
    float2* ml = reinterpret_cast<float2*>(xch + LockstepXch::partials);
    ml[half * 128 + tid] = make_float2(row_max[0], row_sum[0]);
    ptx::named_sync(3, 256);
    const float2 theirs = ml[(1 - half) * 128 + tid];
    row_max[1] = theirs.x, row_sum[1] = theirs.y;
  }
};

}  // namespace smla::cuda
