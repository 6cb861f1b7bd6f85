// The sm_90a sparse MLA decode kernel. One CTA = up to 64 heads of one token x one slice of
// its columns. Warpgroup 0 gathers KV rows into 128B-swizzled shared memory as bf16 (f16 for
// an e4m3 cache with an e4m3 query), a few tiles ahead (cp.async for bf16 caches; fp8 records
// are copied raw, then converted);
// warpgroups 1 and 2 each own 256 of the 512 dims: they compute partial scores over their half
// with wgmma and exchange them through shared memory; each runs the online softmax of half the
// rows and hands its P to the other; both accumulate P.V for their half of the output. Splits
// of a row are reduced in the same launch by the last CTA to arrive (SPEC §3).
#pragma once
#include "cuda/decode_epilogue.cuh"
#include "cuda/decode_producer.cuh"

namespace smla::cuda {

template <KvLayout L, bool kTopk, bool kF16>
__device__ __forceinline__ void consume(const DecodeParams& p, const Work& w, uint8_t* smem) {
  constexpr int kStagesL = kStages<L>;
  Consumer<kStagesL, kF16> c;
  c.half = threadIdx.x / 128 - 1;  // which 256 dims this warpgroup owns
  c.tid = threadIdx.x % 128, c.warp = c.tid / 32, c.lane = c.tid % 32;
  uint8_t* q_half = smem + Smem::q + c.half * 4 * kQChunkBytes;
  const uint32_t kv_half = ptx::smem_addr(smem + Smem::kv) + c.half * 4 * kKvChunkBytes;
  c.q_desc = ptx::sw128_desc(ptx::smem_addr(q_half), 16, 1024);
  c.k_desc = ptx::sw128_desc(kv_half, 16, 1024);
  c.v_desc = ptx::sw128_desc(kv_half, kKvChunkBytes, 1024);
  c.full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  c.empty = c.full + kStagesL;
  c.xch = smem + Smem::xch;
  c.mask = smem + Smem::mask;

  // Query half: 64 rows x 256 dims as bf16 (an e4m3 query: f16, exactly), warpgroup 2's rows r
  // and r ^ 8 swapped (Xch); rows past the live heads are zeros (no padded copy).
  for (int i = c.tid; i < kMmaRows * 32; i += 128) {
    const int row = i / 32, unit = i % 32, head_row = row ^ (8 * c.half);
    const bool live = head_row < w.live_heads;
    const int64_t at = int64_t(w.token) * p.q_token_stride +
                       int64_t(w.head0 + head_row) * p.q_head_stride + c.half * 256 + unit * 8;
    uint8_t* dst = q_half + (unit / 8) * kQChunkBytes + swizzle(row, unit % 8);
    if constexpr (kF16) {
      const uint2 v =
          live ? __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.query) + at))
               : make_uint2(0, 0);
      *reinterpret_cast<uint4*>(dst) = e4m3x8_to<true>(v.x, v.y, 1.f);
    } else {
      ptx::cp_async_16(ptx::smem_addr(dst),
                       static_cast<const __nv_bfloat16*>(p.query) + (live ? at : 0), live);
    }
  }
  ptx::cp_async_commit();
  if constexpr (kTopk)  // while the query loads
    stage_topk(p, w.token, w.request, threadIdx.x - 128,
               reinterpret_cast<int32_t*>(smem + Smem::topk));
  ptx::cp_async_wait<0>();
  ptx::fence_proxy_async();
  ptx::named_sync(1 + c.half, 128);

#pragma unroll
  for (int i = 0; i < 128; ++i) c.o[i] = 0.f;
  c.row_max[0] = -INFINITY;  // fragment row 0: the one this warpgroup finishes
  c.row_sum[0] = 0.f;
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
  if (tiles > 0) ptx::mbar_arrive(&c.empty[(tiles - 1) % kStagesL]);

  c.finish_rows();
  const int thread = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  if (p.num_splits > 1)
    finish_split(p, w, c, smem, thread);
  else
    store_output(p, w, c, smem, thread);
}
// The producer needs a few more registers when it converts fp8 rows.
template <KvLayout L>
constexpr int kProducerRegs = L == KvLayout::bf16 ? 40 : 56;
// setmaxnreg only moves registers within the CTA's launch allocation (168 a thread at 384
// threads): a consumer asking for more than the producer gave back waits forever.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kWarpgroups = kThreads / 128;  // one producer, the rest consumers
template <KvLayout L>
constexpr int kConsumerRegs =
    (kWarpgroups * kLaunchRegs - kProducerRegs<L>) / (kWarpgroups - 1) / 8 * 8;

// kTopk: the launch reads TopkColumns. Only the consumers' staging is compiled per source; the
// producer tests p.topk at run time (compiling it out too measured slower: docs/kernel.md).
// kF16: an e4m3 cache with an e4m3 query, computed in f16 (one conversion per two values).
template <KvLayout L, bool kTopk, bool kF16>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ DecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  // Offsetting the __shared__ array (not an integer cast) keeps shared-memory instructions.
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();  // the previous kernel (a table build, a layer) may write what we read
  // The producer's first indices load alongside the row's metadata.
  const int first_tile = blockIdx.x / p.head_blocks % p.num_splits * p.tiles_per_split;
  const int token = blockIdx.x / (p.head_blocks * p.num_splits);
  IndexPipe indices;
  if (threadIdx.x < 128)
    for (int k = 0; k < IndexPipe::kAhead; ++k) indices.q[k] = load_index(p, token, first_tile + k);
  const bool topk = p.topk.indices != nullptr;
  Work w = locate_work(p);
  int* topk_counts = reinterpret_cast<int*>(smem + Smem::counts);
  if (topk && threadIdx.x < 128) {  // the row's entries >= 0, for its length
    const int count = __reduce_add_sync(~0u, count_topk(p, token, threadIdx.x));
    if (threadIdx.x % 32 == 0) topk_counts[threadIdx.x / 32] = count;
  }
  if (threadIdx.x == 0) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Smem::bars);
    for (int s = 0; s < kStages<L>; ++s) {
      ptx::mbar_init(&bars[s], 128 + 32);          // full: 128 producer threads + 32 flag writers
      ptx::mbar_init(&bars[kStages<L> + s], 256);  // empty: every consumer thread
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();
  int count = 0;
  if (topk)
#pragma unroll
    for (int i = 0; i < 4; ++i) count += topk_counts[i];
  w.set_length(p, topk ? p.window + topk_length(p, w, count) : w.topk_len);
  if (threadIdx.x < 128) {
    ptx::reg_dealloc<kProducerRegs<L>>();
    if constexpr (L == KvLayout::bf16)
      produce_bf16(p, w, smem, indices);
    else
      produce_fp8<L, kF16>(p, w, smem, indices);
    indices.finish(p);
  } else {
    ptx::reg_alloc<kConsumerRegs<L>>();
    consume<L, kTopk, kF16>(p, w, smem);
  }
}

}  // namespace smla::cuda
