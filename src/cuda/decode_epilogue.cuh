// The decode kernel's epilogue: final scaling, 16-byte output writes, and the in-launch
// reduction of split rows: in their cluster, or through the counters (SPEC §3).
#pragma once
#include "cuda/decode_layout.cuh"

namespace smla::cuda {

// The CTA's live heads' sinks in log2 units (-inf without sinks), staged by the consumers while
// their query loads: loaded in the epilogue, a global load sat on its path (2 x 2: -1 to -1.7%).
__device__ __forceinline__ void stage_sinks(const DecodeParams& p, const Work& w, uint8_t* smem,
                                            int thread) {
  if (thread < w.live_heads)
    reinterpret_cast<float*>(smem + Smem::sinks)[thread] =
        p.sinks ? __ldg(p.sinks + w.head0 + thread) * kLog2e : -INFINITY;
}

// Output = factor * o for CTA row `row` with running max `m` (log2 units) and sum `l`; writes
// lse.
__device__ __forceinline__ float finish_row(const DecodeParams& p, const Work& w,
                                            const uint8_t* smem, int row, float m, float l,
                                            bool write_lse) {
  const int head = w.head0 + row;
  if (write_lse && p.lse)
    p.lse[w.token * p.lse_token_stride + head] =
        m == -INFINITY ? -INFINITY : (m + __log2f(l)) * kLn2;
  const float sink = reinterpret_cast<const float*>(smem + Smem::sinks)[row];
  const float top = fmaxf(m, sink);
  if (m == -INFINITY || top == INFINITY) return 0.f;  // no attended column, or a +inf sink
  const float scale = exp2f(m - top);
  return p.bmm2_scale * scale / (l * scale + exp2f(sink - top));
}

__device__ __forceinline__ __nv_bfloat16* out_row(const DecodeParams& p, int token, int head) {
  return static_cast<__nv_bfloat16*>(p.out) + token * p.out_token_stride + head * p.out_head_stride;
}

// Heads H..H_out-1 are zeros, written once per token. The last head block's rows past H are
// not written from their sums: a zero query's scores are 0 x k, NaN where a row holds an inf.
__device__ __forceinline__ void zero_tail_heads(const DecodeParams& p, int token, int thread) {
  // 64-bit: (H_out - H) x 64 chunks may end within 256 of 2^31.
  for (int64_t i = thread; i < int64_t(p.out_heads - p.num_heads) * kRowChunks; i += 256) {
    const int head = p.num_heads + int(i / kRowChunks), unit = int(i % kRowChunks);
    reinterpret_cast<uint4*>(out_row(p, token, head))[unit] = make_uint4(0, 0, 0, 0);
  }
}

// Split rows stage their output (and a cluster's CTAs their partial O) as bf16 in the idle KV
// buffers (kOutPitch apart), then write it in 16-byte chunks. Stages output columns (col,
// col + 1) of `row` (< heads_per_cta) from two f32 values.
__device__ __forceinline__ void stage_pair(uint8_t* smem, int row, int col, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(smem + Smem::kv + row * kOutPitch + col * 2) =
      __floats2bfloat162_rn(a, b);
}

__device__ __forceinline__ void write_staged(const DecodeParams& p, const Work& w, uint8_t* smem,
                                             int thread) {
  ptx::named_sync(kEpilogueBarrier, 256);
  for (int i = thread; i < p.heads_per_cta * kRowChunks; i += 256) {
    const int row = i / kRowChunks, unit = i % kRowChunks, head = w.head0 + row;
    if (head < p.num_heads)
      reinterpret_cast<uint4*>(out_row(p, w.token, head))[unit] =
          *reinterpret_cast<const uint4*>(smem + Smem::kv + row * kOutPitch + unit * 16);
  }
  if (w.head_block == p.head_blocks - 1) zero_tail_heads(p, w.token, thread);
}

// Stages this thread's part of fragment row r (row_of(r) < heads_per_cta). Fragment `o`
// element i sits at row row_of((i >> 1) & 1) and column 8 (i / 4) + 2 (lane % 4) + (i & 1) of
// this warpgroup's half.
template <class Consumer>
__device__ __forceinline__ void stage_o(const Consumer& c, uint8_t* smem, int r) {
#pragma unroll
  for (int j = 0; j < 32; ++j)
    stage_pair(smem, c.row_of(r), c.half * 256 + 8 * j + 2 * (c.lane % 4),
               c.o[4 * j + 2 * r], c.o[4 * j + 2 * r + 1]);
}

// An unsplit row's output straight from the fragments, 16 bytes a store: a quad's 4 x 4 words
// of blocks 4g..4g+3 transposed by two shuffle rounds (xor 2, then xor 1), so that lane q holds
// the 16 bytes of block 4g + q. No barrier and no shared-memory round trip. Measured slower:
// 4-byte stores of the fragments as they are (8-20%), and the former staging through shared
// memory (0.4-1.7%; docs/kernel_measured.md).
template <class Consumer>
__device__ __forceinline__ void store_output(const DecodeParams& p, const Work& w,
                                             const Consumer& c, const uint8_t* smem, int thread) {
  const bool hi = c.lane & 2, odd = c.lane & 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.row_of(r), head = w.head0 + row;
    const float factor = row < w.live_heads
                             ? finish_row(p, w, smem, row, c.row_max[r], c.row_sum[r],
                                          c.half == 0 && c.lane % 4 == 0)
                             : 0.f;
    const bool write = row < p.heads_per_cta && head < p.num_heads;  // the quad's alike
    uint4* out = reinterpret_cast<uint4*>(out_row(p, w.token, head)) + c.half * 32 + c.lane % 4;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      uint32_t a[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // fragment columns 8 (4g + k) + 2 (lane % 4), + 1
        const int i = 4 * (4 * g + k) + 2 * r;
        const __nv_bfloat162 h = __floats2bfloat162_rn(c.o[i] * factor, c.o[i + 1] * factor);
        a[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
      const uint32_t r0 = __shfl_xor_sync(~0u, hi ? a[0] : a[2], 2);
      const uint32_t r1 = __shfl_xor_sync(~0u, hi ? a[1] : a[3], 2);
      if (hi) a[0] = r0, a[1] = r1; else a[2] = r0, a[3] = r1;
      const uint32_t t0 = __shfl_xor_sync(~0u, odd ? a[0] : a[1], 1);
      const uint32_t t1 = __shfl_xor_sync(~0u, odd ? a[2] : a[3], 1);
      if (odd) a[0] = t0, a[2] = t1; else a[1] = t0, a[3] = t1;
      if (write) out[4 * g] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
  if (w.head_block == p.head_blocks - 1) zero_tail_heads(p, w.token, thread);
}

// The last CTA of a split row sums every split's partial in split order (deterministic), each
// thread a sixteenth, eighth or quarter of one of kHeads (16, 32, 64) rows, into the output
// stage.
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
  // Loads in batches of at most 16 vectors: 128 accumulators and 128 loaded values do not fit
  // beside the consumers' other registers (ptxas spilled in the e4m3 kernels).
  constexpr int kBatch = kVectors < 16 ? kVectors : 16;
  for (int s = 0; s < p.num_splits; ++s) {
    const float4* o = reinterpret_cast<const float4*>(row_partials + s * stride + row * 512) + part;
    const float wgt = weights[s * kHeads + row];
#pragma unroll
    for (int b = 0; b < kVectors; b += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) v[k] = __ldcg(o + (b + k) * kThreadsPerRow);
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        acc[b + k].x += wgt * v[k].x, acc[b + k].y += wgt * v[k].y, acc[b + k].z += wgt * v[k].z,
            acc[b + k].w += wgt * v[k].w;
    }
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
template <class Consumer>
__device__ __forceinline__ void finish_split(const DecodeParams& p, const Work& w,
                                             const Consumer& c, uint8_t* smem, int thread) {
  const int heads = p.heads_per_cta;
  const int64_t stride = partial_floats(heads);
  // The row's partials, split by split; computed again for the combine (ptx::opaque), so the
  // pointer is not held in a register through the stores of o.
  const auto partials_of = [&](int token) {
    return p.partials + (int64_t(token) * p.head_blocks + w.head_block) * p.num_splits * stride;
  };
  float* mine = partials_of(w.token) + w.split * stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.row_of(r);
    if (row >= heads) continue;
    float2* dst = reinterpret_cast<float2*>(mine + row * 512 + c.half * 256 + (c.lane % 4) * 2);
#pragma unroll
    for (int j = 0; j < 32; ++j)
      __stcg(dst + j * 4, make_float2(c.o[4 * j + 2 * r], c.o[4 * j + 2 * r + 1]));
    if (c.half == 0 && c.lane % 4 == 0)
      __stcg(reinterpret_cast<float2*>(mine + heads * 512) + row,
             make_float2(c.row_max[r], c.row_sum[r]));
  }
  __threadfence();
  ptx::named_sync(kEpilogueBarrier, 256);
  int32_t* counter = p.counters + int64_t(w.token) * p.head_blocks + w.head_block;
  int* is_last = reinterpret_cast<int*>(smem + Smem::flag);
  if (thread == 0) *is_last = atomicAdd(counter, 1) == p.num_splits - 1;
  ptx::named_sync(kEpilogueBarrier, 256);
  if (!*is_last) return;
  __threadfence();
  if (thread == 0) *counter = 0;  // back to zero for the next launch (SPEC §3)
  const float* row_partials = partials_of(ptx::opaque(w.token));

  // Per row: the max over splits, each split's weight, the sum, and the output factor.
  float2* ml = reinterpret_cast<float2*>(smem + Smem::xch);              // [split][row]
  float* weights = reinterpret_cast<float*>(ml + kMaxSplits * kMmaRows);  // [split][row]
  float* factors = weights + kMaxSplits * kMmaRows;                       // [row]
  for (int i = thread; i < p.num_splits * heads; i += 256)
    ml[i] =
        __ldcg(reinterpret_cast<const float2*>(row_partials + (i / heads) * stride + heads * 512) +
               i % heads);
  ptx::named_sync(kEpilogueBarrier, 256);
  if (thread < heads) {
    float m = -INFINITY, l = 0.f;
    for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, ml[s * heads + thread].x);
    const float base = m == -INFINITY ? 0.f : m;
    for (int s = 0; s < p.num_splits; ++s) {
      const float weight = exp2f(ml[s * heads + thread].x - base);
      l += weight * ml[s * heads + thread].y;
      weights[s * heads + thread] = weight;
    }
    factors[thread] =
        thread < w.live_heads ? finish_row(p, w, smem, thread, m, l, true) : 0.f;
  }
  ptx::named_sync(kEpilogueBarrier, 256);
  switch (heads) {
    case 16: combine_rows<16>(p, row_partials, weights, factors, smem, thread); break;
    case 32: combine_rows<32>(p, row_partials, weights, factors, smem, thread); break;
    default: combine_rows<64>(p, row_partials, weights, factors, smem, thread); break;
  }
  write_staged(p, w, smem, thread);
}

// A split row reduced in its cluster (rank = split): each CTA stages its unnormalized O rows (as
// bf16: half the 16-byte chunks read through distributed shared memory, this step's main cost)
// and (max, sum) per row in its own shared memory; after a cluster barrier, CTA s combines the
// s-th of num_splits ranges of 16-byte chunks from every CTA's, in split order (deterministic),
// and writes those outputs. A second barrier keeps each CTA's shared memory until all have read
// it.
static_assert(kMmaRows * (kMaxClusterSplits + 1) * 4 <= Smem::xch_bytes,
              "a CTA's split weights and factors fit in the exchange buffers");

// kMaxPeers: the splits this copy's loops are unrolled for (8, or kMaxClusterSplits for the
// non-portable sizes: unrolled for 16, rows of up to 8 splits measured 2-5% slower).
template <int kMaxPeers, class Consumer>
__device__ __forceinline__ void finish_cluster(const DecodeParams& p, const Work& w,
                                               const Consumer& c, uint8_t* smem, int thread) {
  const int heads = p.heads_per_cta, splits = p.num_splits;
  // O overlays the KV tiles and (max, sum) the query: the other warpgroup's last wgmma may
  // still read them.
  ptx::named_sync(kEpilogueBarrier, 256);
  float2* ml = reinterpret_cast<float2*>(smem + Smem::q);  // [row]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = c.row_of(r);
    if (row >= heads) continue;
    stage_o(c, smem, r);
    if (c.half == 0 && c.lane % 4 == 0) ml[row] = make_float2(c.row_max[r], c.row_sum[r]);
  }
  ptx::cluster_sync();

  // My chunks' rows: each split's weight and the output factor, from every CTA's (max, sum).
  const int chunks = heads * kRowChunks;
  const int begin = w.split * chunks / splits, end = (w.split + 1) * chunks / splits;
  const int first_row = begin / kRowChunks, rows = (end - 1) / kRowChunks + 1 - first_row;
  float* weights = reinterpret_cast<float*>(smem + Smem::xch);  // [row][split], then factor
  constexpr int kPitch = kMaxPeers + 1;
  if (thread < rows) {
    const int row = first_row + thread;
    float2 part[kMaxPeers];
#pragma unroll
    for (int s = 0; s < kMaxPeers; ++s)
      if (s < splits) part[s] = *ptx::cluster_map(ml + row, s);
    float m = -INFINITY, l = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxPeers; ++s)
      if (s < splits) m = fmaxf(m, part[s].x);
    const float base = m == -INFINITY ? 0.f : m;
#pragma unroll
    for (int s = 0; s < kMaxPeers; ++s)
      if (s < splits) {
        const float weight = ptx::exp2_approx(part[s].x - base);
        l += weight * part[s].y;
        weights[thread * kPitch + s] = weight;
      }
    weights[thread * kPitch + kMaxPeers] =
        row < w.live_heads
            ? finish_row(p, w, smem, row, m, l, row * kRowChunks >= begin)  // lse: once
            : 0.f;
  }
  ptx::named_sync(kEpilogueBarrier, 256);

  // My chunks: the splits' O in split order, weighted, times the factor. One chunk a pass: this
  // code runs once a CTA, cold in the instruction cache (unrolled twice it was 2.3x the code and
  // up to 3% slower).
  const int live_end = min(end, w.live_heads * kRowChunks);  // heads past H: zero_tail_heads
#pragma unroll 1
  for (int i = begin + thread; i < live_end; i += 256) {
    const int row = i / kRowChunks, unit = i % kRowChunks;
    const uint4* at = reinterpret_cast<const uint4*>(smem + Smem::kv + row * kOutPitch) + unit;
    uint4 v[kMaxPeers];
#pragma unroll
    for (int s = 0; s < kMaxPeers; ++s)
      if (s < splits) v[s] = *ptx::cluster_map(at, s);
    const float* weight = weights + (row - first_row) * kPitch;
    float2 acc[4] = {};
#pragma unroll
    for (int s = 0; s < kMaxPeers; ++s)
      if (s < splits) {
        const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v[s]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(h[k]);
          acc[k].x += weight[s] * f.x, acc[k].y += weight[s] * f.y;
        }
      }
    const float factor = weight[kMaxPeers];
    uint4 out;
    auto* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      o[k] = __floats2bfloat162_rn(acc[k].x * factor, acc[k].y * factor);
    reinterpret_cast<uint4*>(out_row(p, w.token, w.head0 + row))[unit] = out;
  }
  if (w.split == 0 && w.head_block == p.head_blocks - 1) zero_tail_heads(p, w.token, thread);
  // The output stores need not complete first. Every chunk load above feeds a store, so it is
  // complete before the arrive (SASS-checked).
  ptx::cluster_sync_relaxed();
}

}  // namespace smla::cuda
