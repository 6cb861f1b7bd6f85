// The sm_90a sparse MLA decode kernel (bf16 KV). One CTA = up to 64 heads of one token x one
// slice of its columns. Warpgroup 0 gathers KV rows with cp.async into 128B-swizzled shared
// memory, kStages tiles ahead; warpgroups 1 and 2 each own 256 of the 512 dims: they compute
// partial scores over their half with wgmma, exchange them through shared memory, run the same
// online softmax, and accumulate P.V for their half of the output. Splits of a row are reduced
// in the same launch by the last CTA to arrive (SPEC §3).
#pragma once
#include "cuda/decode_epilogue.cuh"
#include "cuda/decode_producer.cuh"

namespace smla::cuda {

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
