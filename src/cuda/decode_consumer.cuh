// The consumer's core (decode_seesaw.cuh schedules it): its registers and shared-memory handles,
// P's packing, the wgmma issues and the query load.
#pragma once
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/decode_layout.cuh"

namespace smla::cuda {

// A row's base (what its P, O and sums are relative to) moves only when a tile's max exceeds it
// by this much (log2 units): until then the 128-register rescale of O is skipped. P up to
// 2^threshold costs no precision (bf16 and f16 are relative; O and the sums are float32), only
// float32 range (docs/decode.md); f16 P (kF16) must stay under 2^16.
template <bool kF16>
constexpr float kRescaleThreshold = kF16 ? 15.f : 32.f;
// A raised base sits this far above the tile max that raised it: f16 P then reaches 2^15 only
// 23 log2 units above that max (its largest P is 2^-8, still a normal f16).
template <bool kF16>
constexpr float kBaseLift = kF16 ? 8.f : 0.f;

// kF16: an e4m3 cache read with an e4m3 query: the scores are e4m3 wgmma over the query and the
// raw tiles as they are, the stages hold V as f16, so P is f16. A warpgroup's scores read all
// 512 dims; it accumulates P.V over its half.
// kQueryRegSteps: that many of the scores' k steps take Q from registers (A-operand words, loaded
// once the query has landed), so that those wgmma read 1 KiB of shared memory, not 3: the score
// wgmma are bound by their operand reads (docs/kernel.md). They are spread evenly over the steps
// (register slot j is step reg_step(j)), so that at most two steps reading Q from shared memory
// come in a row (bf16 128 x 2 H=128 -1.1% against the first eleven steps; smla_wgmma_probe).
template <int kNumStages, bool kF16, int kQueryRegSteps>
struct ConsumerCore {
  static constexpr int kPSteps = kTileColumns / 16;  // k16 steps of P.V
  static constexpr int kScoreSteps = 512 / (kF16 ? 32 : 16);
  static_assert(0 < kQueryRegSteps && kQueryRegSteps <= kScoreSteps, "query register steps");
  __host__ __device__ static constexpr int reg_step(int j) {
    return j * kScoreSteps / kQueryRegSteps;
  }
  // The register slot of step k, or -1 where it reads Q from shared memory.
  __host__ __device__ static constexpr int reg_slot(int k) {
    const int j = (k * kQueryRegSteps + kScoreSteps - 1) / kScoreSteps;
    return j < kQueryRegSteps && reg_step(j) == k ? j : -1;
  }
  // Every register slot is the slot of exactly one step (checked where the scores are issued).
  __host__ __device__ static constexpr bool reg_slots_cover_steps() {
    int slots = 0;
    for (int k = 0; k < kScoreSteps; ++k)
      if (const int j = reg_slot(k); j >= 0) {
        if (reg_step(j) != k) return false;
        ++slots;
      }
    return slots == kQueryRegSteps;
  }
  int half, tid, warp, lane;
  // Q, K and V of stage 0 as this warpgroup reads them (kF16: K from the shared-memory base).
  uint64_t q_desc, k_desc, v_desc;
  uint64_t *full, *empty;
  uint8_t* xch;
  const float* bias;  // [stage][column]: 0, or -inf for a column not attended
  float o[128];
  float row_max[2], row_sum[2];  // by fragment row
  uint32_t qa[kQueryRegSteps][4];

  __device__ __forceinline__ void init(uint8_t* smem) {
    half = threadIdx.x / 128 - 1;
    tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    // The broadcast, so that ptxas knows it is warp-uniform: the descriptors then live in
    // uniform registers, not converted for each wgmma (bf16 128 x 2 H=128 -2.6%).
    const int wg = __shfl_sync(~0u, half, 0);
    const uint32_t kv_half = ptx::smem_addr(smem + Smem::kv) + wg * 4 * kKvChunkBytes;
    q_desc = ptx::sw128_desc(ptx::smem_addr(smem + Smem::q), 16, 1024);
    // kF16: the raw tiles' base; issue_scores adds the tile's raw_offset.
    k_desc = ptx::sw128_desc(ptx::smem_addr(kF16 ? smem : smem + Smem::kv), 16, 1024);
    v_desc = ptx::sw128_desc(kv_half, kKvChunkBytes, 1024);
    full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
    empty = full + kNumStages;
    xch = smem + Smem::xch;
    bias = reinterpret_cast<const float*>(smem + Smem::bias);
  }

  // Instead of load_query, for 64 heads a CTA: the first thread of each consumer warpgroup
  // requests half of the CTA's heads' query bytes by TMA, 8 heads x 128 bytes a box (heads past
  // H arrive as zeros), at the kernel's start: the load/store unit is then the first tile's
  // alone. wait_query<true> completes it. More issuing threads measured at most 1-2.5% faster
  // and racecheck flags them unless they are in different warps, where they gain nothing
  // (docs/kernel_measured.md).
  static __device__ __forceinline__ uint64_t* query_bar(uint8_t* smem, int half) {
    return reinterpret_cast<uint64_t*>(smem + Smem::query_bars) + half;
  }
  static __device__ __forceinline__ void request_query(const QueryTmaParams& p, uint8_t* smem,
                                                       uint64_t policy) {
    const int half = threadIdx.x / 128 - 1;
    constexpr int kGroups = kMmaRows / 8;
    constexpr int kChunks = kF16 ? 2 : 4;  // of 128 bytes a row: an e4m3 query has four
    uint64_t* bar = query_bar(smem, half);
    ptx::mbar_init(bar, 1);
    ptx::mbar_init_fence();
    ptx::mbar_arrive_expect_tx(bar, kGroups * kChunks * 1024);
    const int head0 = cta_head_block(p) * p.heads_per_cta;
    const int token = cta_token(p);
#pragma unroll
    for (int group = 0; group < kGroups; ++group) {
#pragma unroll
      for (int chunk = half * kChunks; chunk < (half + 1) * kChunks; ++chunk)
        ptx::tma_load_3d(ptx::smem_addr(smem + Smem::q + chunk * kQChunkBytes + group * 8 * 128),
                         &p.q_map, chunk * (kF16 ? 128 : 64), head0 + 8 * group, token, bar,
                         policy);
    }
  }

  // This warpgroup's 256 dims of the query's 64 rows as bf16 (an e4m3 query: as it is, the
  // scores' e4m3 wgmma read it); rows past the live heads are zeros, stored plainly: zero-fill
  // copies would hold the load/store unit that issues the first tile's copies (2 x 2 H=64: -1%).
  // wait_query completes it.
  __device__ __forceinline__ void load_query(const DecodeParams& p, const Work& w, uint8_t* smem) {
    if constexpr (kF16) {  // 64 rows x 512 e4m3 in four chunks of 128 dims, 8 bytes a copy
      for (int i = tid; i < kMmaRows * 32; i += 128) {
        const int row = i / 32, piece = half * 32 + i % 32, unit = piece / 2;
        uint8_t* dst = smem + Smem::q + (unit / 8) * kQChunkBytes + swizzle(row, unit % 8) +
                       8 * (piece % 2);
        if (row < w.live_heads)
          ptx::cp_async_8(ptx::smem_addr(dst),
                          static_cast<const uint8_t*>(p.query) +
                              int64_t(w.token) * p.q_token_stride +
                              int64_t(w.head0 + row) * p.q_head_stride + piece * 8,
                          true);
        else
          *reinterpret_cast<uint2*>(dst) = make_uint2(0, 0);
      }
      ptx::cp_async_commit();
      return;
    }
    uint8_t* q_half = smem + Smem::q + half * 4 * kQChunkBytes;
    for (int i = tid; i < kMmaRows * 32; i += 128) {
      const int row = i / 32, unit = i % 32;
      const bool live = row < w.live_heads;
      const int64_t at = int64_t(w.token) * p.q_token_stride +
                         int64_t(w.head0 + row) * p.q_head_stride + half * 256 + unit * 8;
      uint8_t* dst = q_half + (unit / 8) * kQChunkBytes + swizzle(row, unit % 8);
      if (live) {
        ptx::cp_async_16(ptx::smem_addr(dst), static_cast<const __nv_bfloat16*>(p.query) + at,
                         true);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    ptx::cp_async_commit();
  }
  template <bool kQueryTma>  // request_query's, else load_query's
  __device__ __forceinline__ void wait_query(uint8_t* smem) {
    if constexpr (kQueryTma)
      ptx::mbar_wait(query_bar(smem, half), 0);
    else
      ptx::cp_async_wait<0>();
    ptx::fence_proxy_async();
    ptx::named_sync(kQueryBarrier, 256);
    // The rows start empty (here, not in init: o live across the query load costs spills).
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    for (int r = 0; r < 2; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;
    ptx::fence_operands(o);  // keep the zeroing out of any wgmma's flight
    // Word [j][i] of step k = reg_step(j): row 16 warp + lane / 4 + 8 (i & 1), bytes 32k + 16
    // (i / 2) + 4 (lane % 4) to + 3 of a query row (bf16: dims 16k + 8 (i / 2) + 2 (lane % 4),
    // + 1; e4m3: 32k + ..., + 3).
#pragma unroll
    for (int j = 0; j < kQueryRegSteps; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 16 * warp + lane / 4 + 8 * (i & 1);
        const int byte = 32 * reg_step(j) + 16 * (i / 2);
        qa[j][i] = *reinterpret_cast<const uint32_t*>(
            smem + Smem::q + (byte / 128) * kQChunkBytes + swizzle(row, byte % 128 / 16) +
            4 * (lane % 4));
      }
  }

  // Two P values as one A-operand word.
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    if constexpr (kF16) {
      const __half2 h = __floats2half2_rn(a, b);
      return *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
      return *reinterpret_cast<const uint32_t*>(&h);
    }
  }

  // Issues k steps kBegin..kEnd-1 of the scores of the tile in `buffer`, a stage (kF16: a raw
  // buffer), as one commit group. A k step is 32 bytes of a 128-byte swizzled row either way.
  template <int kBegin, int kEnd>
  __device__ __forceinline__ void issue_scores(float (&s)[kScores], int buffer) {
    static_assert(reg_slots_cover_steps(), "query register slots and score steps");
    const uint64_t k_tile =
        k_desc + ptx::desc_offset(kF16 ? raw_offset<KvLayout::fp8_e4m3, true>(buffer)
                                       : buffer * kTileBytes);
    if constexpr (kBegin == 0) ptx::fence_operands(s);
    ptx::wgmma_fence();
#pragma unroll
    for (int k = kBegin; k < kEnd; ++k) {
      const uint64_t a = q_desc + ptx::desc_offset((k / 4) * kQChunkBytes + (k % 4) * 32);
      const uint64_t b = k_tile + ptx::desc_offset((k / 4) * kKvChunkBytes + (k % 4) * 32);
      const int slot = reg_slot(k);
      const uint32_t(&q)[4] = qa[slot < 0 ? 0 : slot];
      if (slot >= 0) {
        if constexpr (kF16)
          ptx::wgmma_m64n32k32_rs_e4m3(s, q, b, k > 0);
        else
          ptx::wgmma_m64n32k16_rs(s, q, b, k > 0);
      } else if constexpr (kF16) {
        ptx::wgmma_m64n32k32_ss_e4m3(s, a, b, k > 0);
      } else {
        ptx::wgmma_m64n32k16_ss(s, a, b, k > 0);
      }
    }
    ptx::wgmma_commit();
  }

  // Issues P.V of the tile in `stage` over this warpgroup's 256 output dims, P (A) from
  // registers (words) or from shared memory (a descriptor, SeesawXch's layout).
  template <class PSource>
  __device__ __forceinline__ void issue_pv(const PSource& pa, int stage) {
    const uint64_t v_stage = v_desc + ptx::desc_offset(stage * kTileBytes);
    ptx::fence_operands(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kPSteps; ++k) {
      const uint64_t v = v_stage + ptx::desc_offset(k * 16 * 128);
      if constexpr (std::is_same_v<PSource, uint64_t>)
        ptx::wgmma_m64n256k16_ss<kF16>(o, pa + ptx::desc_offset(2 * k * SeesawXch::p_lbo), v);
      else
        ptx::wgmma_m64n256k16_rs<kF16>(o, pa[k], v);
    }
    ptx::wgmma_commit();
  }

  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
    if (__any_sync(~0u, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
  }
};

}  // namespace smla::cuda
