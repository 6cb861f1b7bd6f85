// The sm_90a sparse MLA decode kernel. One CTA = up to 64 heads of one token x one slice of
// its columns. Warpgroup 0 gathers KV rows into 128B-swizzled shared memory as bf16 (f16 for
// an e4m3 cache with an e4m3 query, whose scores read the raw records), a few tiles ahead
// (cp.async for bf16 caches; fp8 records are copied raw, then converted); warpgroups 1 and 2
// compute the scores, the online softmax and P.V with wgmma as a seesaw over alternate tiles, each
// accumulating half of the output dims.
// Splits of a row are reduced in the same launch: through distributed shared memory by the
// row's cluster, or by the last CTA to arrive on the row's counter (SPEC §3).
#pragma once
#include "cuda/decode_epilogue.cuh"
#include "cuda/decode_producer.cuh"
#include "cuda/decode_seesaw.cuh"

namespace smla::cuda {

template <KvLayout L, bool kF16, bool kQueryTma>
using ConsumerOf = SeesawConsumer<kStages<L>, kF16, L == KvLayout::bf16 || kF16, kQueryTma>;

template <KvLayout L, bool kTopk, bool kF16, bool kQueryTma>
__device__ __forceinline__ void consume(const DecodeParams& p, const Work& w, uint8_t* smem) {
  ConsumerOf<L, kF16, kQueryTma> c;
  c.init(smem);
  if constexpr (!kQueryTma) c.load_query(p, w, smem);
  stage_sinks(p, w, smem, threadIdx.x - 128);
  if constexpr (kTopk)  // while the query loads
    stage_topk(p, w.token, w.request, threadIdx.x - 128,
               reinterpret_cast<int32_t*>(smem + Smem::topk));
  c.template wait_query<kQueryTma>(smem);
  c.run(w.tile_end - w.tile_begin, p);
  c.finish_rows();
  const int thread = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  // This order (the common unsplit case last) measured 1.4-1.9% faster at 128 x 2 than testing
  // it first: ptxas lays out the tile loop differently (docs/benchmarks.md, eleventh session).
  if constexpr (kQueryTma)  // an unsplit plan's
    store_output(p, w, c, smem, thread);
  else if (p.num_splits > kPortableClusterCtas && p.cluster)
    finish_cluster<kMaxClusterSplits>(p, w, c, smem, thread);
  else if (p.num_splits > 1 && p.cluster)
    finish_cluster<kPortableClusterCtas>(p, w, c, smem, thread);
  else if (p.num_splits > 1)
    finish_split(p, w, c, smem, thread);
  else
    store_output(p, w, c, smem, thread);
}

// The producer needs a few more registers when it converts fp8 rows.
template <KvLayout L>
constexpr int kProducerRegs = L == KvLayout::bf16 ? 40 : L == KvLayout::fp8_e4m3 ? 56 : 80;
// setmaxnreg only moves registers within the CTA's launch allocation (168 a thread at 384
// threads): a consumer asking for more than the producer gave back waits forever.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kWarpgroups = kThreads / 128;  // one producer, the rest consumers
template <KvLayout L>
constexpr int kConsumerRegs =
    (kWarpgroups * kLaunchRegs - kProducerRegs<L>) / (kWarpgroups - 1) / 8 * 8;

// kTopk: the launch reads TopkColumns. The consumers' staging is compiled per source, the
// producer's only in the kF16 kernels: elsewhere it measured slower so (docs/kernel_measured.md).
// kF16: an e4m3 cache with an e4m3 query: scores by e4m3 wgmma, P.V in f16 (one conversion per
// two values).
// kQueryTma: the query (bf16, or e4m3 for kF16) by TMA from p.q_map, and no split reduction
// compiled in: dispatched for unsplit plans of 64 heads a CTA,
// where it measured faster (docs/kernel.md).
template <KvLayout L, bool kTopk, bool kF16, bool kQueryTma>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ KernelParams<kQueryTma> p) {
  static_assert(!kQueryTma || L != KvLayout::fp8_e4m3 || kF16,
                "kQueryTma kernels: bf16, fp8_ds_mla and kF16");
  extern __shared__ uint8_t smem_raw[];
  // Offsetting the __shared__ array (not an integer cast) keeps shared-memory instructions.
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  ptx::griddep_launch_dependents();
  // Before the wait, what needs only the launch's parameters and this CTA's shared memory: it
  // overlaps the previous grid's tail.
  const int first_tile = cta_split(p) * p.tiles_per_split;
  const int token = cta_token(p);
  if (threadIdx.x == 0) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Smem::bars);
    for (int s = 0; s < kStages<L>; ++s) {
      // full: 128 producer threads + 32 bias writers (unless they go with raw_full)
      ptx::mbar_init(&bars[s], scores_on_landed<kF16, kQueryTma>(p) ? 128 : 128 + 32);
      ptx::mbar_init(&bars[kStages<L> + s], 256);  // empty: every consumer thread
    }
    ConsumerOf<L, kF16, kQueryTma>::init_barriers(bars);
    if constexpr (kF16)
      for (int i = 0; i < RawTile<L, true>::kBuffers; ++i) {
        ptx::mbar_init(&raw_bars<L>(smem)[i], 128);
        ptx::mbar_init(&raw_full<L>(smem)[i], 128 + 32);
      }
    ptx::mbar_init_fence();
  }
  ptx::griddep_wait();  // the previous kernel (a table build, a layer) may write what we read
  if constexpr (kQueryTma)
    if (threadIdx.x >= 128 && threadIdx.x % 128 == 0)
      ConsumerOf<L, kF16, kQueryTma>::request_query(
          p, smem, ptx::l2_policy(stream_rows<L, kF16>(p) && p.query_evict_first));
  // The producer's first indices load alongside the row's metadata.
  constexpr int kProducerTopk = kF16 ? int(kTopk) : -1;  // see reads_topk
  IndexPipe<kProducerTopk> indices;
  if (threadIdx.x < 128)
    for (int k = 0; k < indices.kAhead; ++k)
      indices.q[k] = load_index<kProducerTopk>(p, token, first_tile + k);
  const bool topk = p.topk.indices != nullptr;
  Work w = locate_work(p);
  int* topk_counts = reinterpret_cast<int*>(smem + Smem::counts);
  if (topk && threadIdx.x < 128) {  // the row's entries >= 0, for its length
    const int count = __reduce_add_sync(~0u, count_topk(p, token, threadIdx.x));
    if (threadIdx.x % 32 == 0) topk_counts[threadIdx.x / 32] = count;
  }
  __syncthreads();
  int count = 0;
  if (topk)
#pragma unroll
    for (int i = 0; i < 4; ++i) count += topk_counts[i];
  w.set_length(p, topk ? p.window + compressed_length(p, w, count) : w.topk_len);
  if (threadIdx.x < 128) {
    ptx::reg_dealloc<kProducerRegs<L>>();
    if constexpr (L == KvLayout::bf16)
      produce_bf16(p, w, smem, indices);
    else if (L == KvLayout::fp8_ds_mla && !kQueryTma && p.num_splits > 1)  // see produce_fp8
      produce_fp8<L, kF16, kProducerTopk, L == KvLayout::fp8_ds_mla>(p, w, smem, indices);
    else if (scores_on_landed<kF16, kQueryTma>(p))
      produce_fp8<L, kF16, kProducerTopk, false, kF16 && !kQueryTma>(p, w, smem, indices);
    else
      produce_fp8<L, kF16, kProducerTopk, false>(p, w, smem, indices);
    indices.finish(p);
    if constexpr (L == KvLayout::bf16 && kQueryTma) prefetch_next_wave(p, w, smem);
  } else {
    ptx::reg_alloc<kConsumerRegs<L>>();
    consume<L, kTopk, kF16, kQueryTma>(p, w, smem);
  }
}

}  // namespace smla::cuda
