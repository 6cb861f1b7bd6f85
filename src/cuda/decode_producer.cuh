// The decode kernel's producer warpgroup: gathers each tile's KV rows into shared memory as
// bf16 whatever the cache layout (f16 in the kF16 kernels, whose scores read the raw e4m3
// tiles), so the consumers' P.V runs one 16-bit wgmma path.
#pragma once
#include "cuda/decode_layout.cuh"
#include "cuda/decode_topk.cuh"
#include "cuda/fp8_convert.cuh"

namespace smla::cuda {

// Four lanes own one row of a tile: its column, source and bias (produce_bf16 spreads the
// copies over the warp differently). Columns that are not attended (SPEC §2 rules 1-3) become
// zero rows that are never read from memory. The lane's row.
__device__ __forceinline__ int producer_row() {
  return (threadIdx.x / 32) % 4 * 8 + threadIdx.x % 32 / 4;
}
// kProducerTopk: whether the launch reads TopkColumns, compiled in (1, 0: the kF16 kernels'
// producers) or tested at run time (-1), whichever measured faster for the kernel
// (docs/kernel_measured.md).
template <int kProducerTopk>
__device__ __forceinline__ bool reads_topk(const DecodeParams& p) {
  if constexpr (kProducerTopk < 0)
    return p.topk.indices != nullptr;
  else
    return kProducerTopk;
}
template <int kProducerTopk>
__device__ __forceinline__ bool topk_column(const DecodeParams& p, int col) {
  return reads_topk<kProducerTopk>(p) && col >= p.window;
}

// The table's offset of this lane's column of `tile` (-1 for a staged top-k column): it does not
// depend on the row's metadata, so the first tiles' load while that is in flight.
template <int kProducerTopk>
__device__ __forceinline__ int32_t load_index(const DecodeParams& p, int token, int tile) {
  const int col = tile * kTileColumns + producer_row();
  if (col >= p.num_columns || topk_column<kProducerTopk>(p, col)) return -1;
  return __ldg(p.sparse_indices + int64_t(token) * p.indices_stride + col);
}

// This lane's column offsets of tiles t to t+kAhead-1: the table's loaded kAhead tiles before
// use, the top-k's read from the stage.
template <int kProducerTopk>
struct IndexPipe {
  static constexpr int kAhead = 3;
  int32_t q[kAhead];
  bool staged = false;  // the producer met the consumers at kTopkBarrier

  // Tile t's storage offset; then the pipe holds t+1..t+kAhead.
  __device__ __forceinline__ int32_t pop(const DecodeParams& p, const Work& w,
                                         const uint8_t* smem, int t) {
    if (reads_topk<kProducerTopk>(p) && !staged && (t + 1) * kTileColumns > p.window)
      wait_for_stage();
    const int col = t * kTileColumns + producer_row(), j = col - p.window;
    const int32_t* topk = reinterpret_cast<const int32_t*>(smem + Smem::topk);
    const int32_t offset = !topk_column<kProducerTopk>(p, col) ? q[0]
                           : j < p.topk.top_k                   ? topk[j]
                                                                : -1;
#pragma unroll
    for (int k = 0; k + 1 < kAhead; ++k) q[k] = q[k + 1];
    q[kAhead - 1] =
        t + kAhead < w.tile_end ? load_index<kProducerTopk>(p, w.token, t + kAhead) : -1;
    return offset;
  }

  // Every producer thread at the same tile (the test above is the tile's), once.
  __device__ __forceinline__ void wait_for_stage() {
    ptx::named_sync(kTopkBarrier, kThreads);
    staged = true;
  }
  // A CTA whose tiles read no top-k column still meets the consumers, before it ends.
  __device__ __forceinline__ void finish(const DecodeParams& p) {
    if (reads_topk<kProducerTopk>(p) && !staged) wait_for_stage();
  }
};

// Whether the KV row copies go to L2 as evicted first, so that the rows streaming through keep
// the query, the output and the tables in L2: where no other CTA reads the rows (one head
// block; the head blocks of a token read its rows within a few CTAs, the later ones from L2:
// H=128 with the hint +1.2%), in the layouts where it measured faster (forty-first session, H=64
// 128 x 2 / 64 x 2: bf16 -1.7% / -7.3%, an e4m3 cache with an e4m3 query -1.2% / -1.6%;
// fp8_ds_mla +2.7% / -0.3%, so not there; beside an evict-first query, bf16 128 x 2 -7%,
// fp8_ds_mla 1.00-1.02x: forty-eighth session).
template <KvLayout L, bool kF16>
__device__ __forceinline__ bool stream_rows(const DecodeParams& p) {
  return (L == KvLayout::bf16 || kF16) && p.head_blocks == 1;
}

// Where one column's row lives; `valid` false for a column that is not attended.
struct RowSource {
  bool valid;
  const char* record;  // the row's first byte
  const char* scales;  // fp8_ds_mla: its 8 scale bytes
};

// Storage offset `offset`'s page and slot in `pool` (pool_slot); whether the pool holds that
// row (in_pool).
struct PoolSlot {
  uint32_t page, slot;
};

__device__ __forceinline__ PoolSlot pool_slot(const PoolParams& pool, int32_t offset) {
  const uint32_t page = pool.span.div(uint32_t(offset));
  return {page, uint32_t(offset) - page * pool.span.divisor};
}

__device__ __forceinline__ bool in_pool(const PoolParams& pool, int32_t offset, PoolSlot s) {
  return offset >= 0 && uint32_t(offset) < pool.rows && s.slot < pool.block_size;
}

__device__ __forceinline__ RowSource row_source(const DecodeParams& p, const Work& w, int col,
                                                int32_t offset) {
  const bool swa = col < p.window;
  const PoolParams& pool = swa ? p.swa : p.compressed;
  RowSource r;
  const PoolSlot s = pool_slot(pool, offset);
  // in_pool spelled out: through the call every kernel's SASS changes (NVVM branches the chain)
  r.valid = col < w.topk_len && (!swa || col < w.swa_len) && offset >= 0 &&
            uint32_t(offset) < pool.rows && s.slot < pool.block_size;
  r.record = r.scales = pool.base;
  if (r.valid) {
    const int64_t page = int64_t(s.page) * pool.block_stride_bytes;
    r.record += page + int64_t(s.slot) * pool.token_stride_bytes;
    r.scales += page + pool.scales_offset_bytes + s.slot * kDsMlaScaleBytes;
  }
  return r;
}

// fp8 rows in 16-byte chunks: lane `part` copies and converts chunks part + 4k, k <
// kChunksPerLane. Chunk c below kFp8Chunks holds dims 16c.. as e4m3 (fp8_ds_mla: scale group
// c / 4 = k); the rest (fp8_ds_mla) hold the RoPE dims as bf16, 8 per chunk. Each lane reads
// back only what it copied itself, so cp.async.wait_group is all the synchronisation needed.
// kF16: the raw tile is laid out for the scores' e4m3 wgmma (RawTile), and converted to f16.
template <KvLayout L, bool kF16>
struct Fp8Rows {
  using Raw = RawTile<L, kF16>;
  static constexpr int kFp8Chunks = (L == KvLayout::fp8_ds_mla ? kNopeDim : kHeadDim) / 16;
  static constexpr int kChunksPerLane = (kFp8Chunks + (kHeadDim - 16 * kFp8Chunks) / 8) / 4;
  static_assert(kFp8Chunks % 4 == 0, "a k's chunks are all e4m3 or all bf16");

  // Where chunk c of `row` lies in a raw tile: chunk_at(row, c) bytes past row_start(row).
  // (*) copy spells the pitched case out: through chunk_at ptxas allocates the fp8_ds_mla
  // kernel's registers differently (its SASS then differs from the unchanged code's).
  static __device__ __forceinline__ int row_start(int row) { return kF16 ? 0 : row * Raw::kPitch; }
  static __device__ __forceinline__ int chunk_at(int row, int c) {
    if constexpr (kF16)
      return (c / 8) * kKvChunkBytes + swizzle(row, c % 8);
    else
      return 16 * c;
  }

  // Where 16-byte unit `unit` of `row` lies in a stage.
  static __device__ __forceinline__ int stage_at(int row, int unit) {
    return (unit / 8) * kKvChunkBytes + swizzle(row, unit % 8);
  }
  // The stage unit of RoPE chunk c (fp8_ds_mla: bf16 as stored, so one unit a chunk).
  static __device__ __forceinline__ int rope_unit(int c) { return kFp8Chunks + c; }

  // This lane's part of `src`'s record (zeros when not attended) into raw buffer `raw`;
  // kRopeDirect: not the RoPE chunks, which copy_rope puts straight into the stage.
  template <bool kEvictFirst, bool kRopeDirect>
  static __device__ __forceinline__ void copy(const RowSource& src, uint8_t* raw, int row,
                                              int part) {
    const uint32_t dst = ptx::smem_addr(raw + row_start(row));
#pragma unroll
    for (int k = 0; k < (kRopeDirect ? kFp8Chunks / 4 : kChunksPerLane); ++k)
      ptx::cp_async_16<kEvictFirst>(
          dst + (kF16 ? chunk_at(row, part + 4 * k) : 16 * (part + 4 * k)),
          src.record + 16 * (part + 4 * k), src.valid);  // (*)
    if constexpr (L == KvLayout::fp8_ds_mla)
      ptx::cp_async_8(ptx::smem_addr(raw + Raw::kScales + (row * 4 + part) * 8), src.scales,
                      src.valid);
  }
  // fp8_ds_mla: this lane's RoPE chunks of `src`'s record into the stage at `stage`, as stored.
  static __device__ __forceinline__ void copy_rope(const RowSource& src, uint8_t* stage, int row,
                                                   int part) {
#pragma unroll
    for (int k = kFp8Chunks / 4; k < kChunksPerLane; ++k) {
      const int c = part + 4 * k;
      ptx::cp_async_16(ptx::smem_addr(stage + stage_at(row, rope_unit(c))), src.record + 16 * c,
                       src.valid);
    }
  }

  // The row as bf16 (kF16: f16) 16-byte units into the 128B-swizzled chunks of the stage at
  // `dst`.
  template <bool kRopeDirect>
  static __device__ __forceinline__ void convert(const uint8_t* raw, uint8_t* dst, int row,
                                                 int part) {
    if constexpr (L == KvLayout::fp8_ds_mla) {
      const uint2 scales =
          *reinterpret_cast<const uint2*>(raw + Raw::kScales + (row * 4 + part) * 8);
      constexpr uint32_t kLimit = kOneFactor * 0x01010101u;
      const bool big =
          (__vcmpgtu4(scales.x, kLimit) | (__vcmpgtu4(scales.y, kLimit) & 0xffffffu)) != 0;
      // Rare: the warp takes a second copy of the code with two multiplies a value, so that
      // the usual one stays straight-line.
      if (__any_sync(~0u, big))
        convert_as<true, kRopeDirect>(raw, dst, row, part, scales);
      else
        convert_as<false, kRopeDirect>(raw, dst, row, part, scales);
    } else {
      convert_as<false, false>(raw, dst, row, part, make_uint2(0, 0));
    }
  }

  template <bool kTwice, bool kRopeDirect>
  static __device__ __forceinline__ void convert_as(const uint8_t* raw, uint8_t* dst, int row,
                                                    int part, uint2 scales) {
    // fp8_ds_mla loads every chunk before the first store: the compiler cannot tell the raw
    // buffer from the stage, so it moves no load above a store, and each chunk would wait out
    // its load (2-3% at 128 x 2, with 24 more producer registers). The e4m3 kernels keep a load
    // a chunk: with those registers taken from the consumers the f16 kernel was 3-5% slower.
    constexpr bool kLoadsFirst = L == KvLayout::fp8_ds_mla;
    constexpr int kChunks = kRopeDirect ? kFp8Chunks / 4 : kChunksPerLane;  // this lane converts
    const uint8_t* src = raw + row_start(row);
    uint4 chunks[kChunks];
#pragma unroll
    for (int k = 0; k < kChunks; ++k)
      if (kLoadsFirst)
        chunks[k] = *reinterpret_cast<const uint4*>(src + chunk_at(row, part + 4 * k));
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = part + 4 * k;
      const uint4 v =
          kLoadsFirst ? chunks[k] : *reinterpret_cast<const uint4*>(src + chunk_at(row, c));
      if (4 * k < kFp8Chunks) {
        const int unit = 2 * c;
        uint4 a, b;
        if constexpr (L == KvLayout::fp8_ds_mla) {
          const Bf16Scale s = bf16_scale((k < 4 ? scales.x : scales.y) >> (8 * (k % 4)) & 0xff);
          a = e4m3x8_scaled<kTwice>(v.x, v.y, s), b = e4m3x8_scaled<kTwice>(v.z, v.w, s);
        } else {
          a = e4m3x8_to<kF16>(v.x, v.y), b = e4m3x8_to<kF16>(v.z, v.w);
        }
        // Spelled out, not stage_at: through it the kF16 top-k kernels' producer spilled 4 bytes.
        uint8_t* chunk = dst + (unit / 8) * kKvChunkBytes;
        *reinterpret_cast<uint4*>(chunk + swizzle(row, unit % 8)) = a;
        *reinterpret_cast<uint4*>(chunk + swizzle(row, unit % 8 + 1)) = b;
      } else {
        *reinterpret_cast<uint4*>(dst + stage_at(row, rope_unit(c))) = v;
      }
    }
  }
};

// The row's column's score bias, 0 if attended and -inf if not (the consumers add it in the fma
// that scales their scores: no test and select): written by the row's first lane and released
// by a plain arrive on the stage's full barrier.
__device__ __forceinline__ void publish_bias(uint8_t* smem, uint64_t* full, int stage, int row,
                                             int part, bool valid) {
  if (part != 0) return;
  reinterpret_cast<float*>(smem + Smem::bias)[stage * kTileColumns + row] =
      valid ? 0.f : -INFINITY;
  ptx::mbar_arrive(full);
}

// bf16: the warp's eight rows (this lane's row's source `src`) into the tile at `dst`, eight
// lanes a row, each lane taking its row's source from the row's first lane: a copy instruction
// then reads 128 contiguous bytes of four rows, not 64 of eight, and the load/store unit's issue
// rate follows the lines an instruction touches (2 x 2: -6 to -8%; docs/benchmarks.md, ninth
// session).
template <bool kEvictFirst>
__device__ __forceinline__ void copy_rows_bf16(uint8_t* dst, const RowSource& src) {
  const int lane = threadIdx.x % 32, warp_row0 = producer_row() - lane / 4;
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    const int owner = 4 * (4 * g + lane / 8), r = warp_row0 + 4 * g + lane / 8;
    const char* record = reinterpret_cast<const char*>(
        __shfl_sync(~0u, reinterpret_cast<uintptr_t>(src.record), owner));
    const bool valid = __shfl_sync(~0u, src.valid, owner);
#pragma unroll
    for (int chunk = 0; chunk < 8; ++chunk)
      ptx::cp_async_16<kEvictFirst>(
          ptx::smem_addr(dst + chunk * kKvChunkBytes + swizzle(r, lane % 8)),
          record + (chunk * 8 + lane % 8) * 16, valid);
  }
}

// bf16: rows land in their stage by cp.async. `indices` starts at the CTA's first tile.
__device__ __forceinline__ void produce_bf16(const DecodeParams& p, const Work& w, uint8_t* smem,
                                             IndexPipe<-1>& indices) {
  constexpr int kNumStages = kStages<KvLayout::bf16>;
  const int row = producer_row(), part = threadIdx.x % 4;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  uint64_t* empty = full + kNumStages;
  const bool stream = stream_rows<KvLayout::bf16, false>(p);
  int n = 0;
  for (int tile = w.tile_begin; tile < w.tile_end; ++tile, ++n) {
    const int32_t offset = indices.pop(p, w, smem, tile);
    const int stage = n % kNumStages;
    const RowSource src = row_source(p, w, tile * kTileColumns + row, offset);
    uint8_t* dst = smem + Smem::kv + stage * kTileBytes;
    if (n >= kNumStages) ptx::mbar_wait(&empty[stage], ((n / kNumStages) - 1) & 1);
    if (stream)
      copy_rows_bf16<true>(dst, src);
    else
      copy_rows_bf16<false>(dst, src);
    ptx::cp_async_arrive(&full[stage]);  // when this thread's copies land
    publish_bias(smem, &full[stage], stage, row, part, src.valid);
  }
}

// bf16, unsplit plans of one head block (kQueryTma): once this CTA's last tile has landed, its
// SM reads no more rows while the consumers finish the row and store it, and every SM of the
// wave gets there together (the waves run in lockstep). Producer warp 0 then fetches into L2
// the query and the first tile's rows (window columns, from the table) of the CTA one wave on,
// so that the next wave's start reads them from L2 instead of queuing at DRAM behind every
// SM's: bf16 H=64 128 x 2 -3.1% (57.1 -> 55.3 us), H=8..32 -1.2 to -1.7%; not for two head
// blocks or the fp8 layouts, where it measured no faster or slower (docs/kernel_measured.md). Only
// offsets inside the pool are fetched: a stale one costs bandwidth, never a wrong result.
__device__ __forceinline__ void prefetch_next_wave(const QueryTmaParams& p, const Work& w,
                                                   uint8_t* smem) {
  const int64_t next = int64_t(blockIdx.x) + p.wave_ctas;  // its token: unsplit, one head block
  if (threadIdx.x >= 32 || p.head_blocks != 1 || next >= gridDim.x) return;
  constexpr int kNumStages = kStages<KvLayout::bf16>;
  const int last = w.tile_end - w.tile_begin - 1;
  if (last >= 0)
    ptx::mbar_wait(reinterpret_cast<uint64_t*>(smem + Smem::bars) + last % kNumStages,
                   (last / kNumStages) & 1);
  if (threadIdx.x == 0 && p.q_head_stride == kHeadDim)  // heads contiguous: one range
    ptx::prefetch_l2(static_cast<const __nv_bfloat16*>(p.query) + next * p.q_token_stride,
                     uint32_t(p.num_heads * kHeadDim * sizeof(__nv_bfloat16)));
  const int col = threadIdx.x;
  if (col >= min(p.num_columns, p.window)) return;
  const int32_t offset = __ldg(p.sparse_indices + next * p.indices_stride + col);
  const PoolSlot s = pool_slot(p.swa, offset);
  if (in_pool(p.swa, offset, s))
    ptx::prefetch_l2(p.swa.base + int64_t(s.page) * p.swa.block_stride_bytes +
                         int64_t(s.slot) * p.swa.token_stride_bytes,
                     kHeadDim * sizeof(__nv_bfloat16));
}

// fp8: tile n+1's records are copied into a raw buffer while tile n converts into its stage.
// kF16: a raw buffer is copied into again once the consumers' scores of its tile are done
// (kLanded, scores_on_landed: and masked; the column biases then go with the records).
// kRopeDirect (fp8_ds_mla): tile n+1's RoPE chunks go straight into its stage once tile n is
// converted, so that stage is waited for a conversion earlier: for split plans, whose CTAs have
// few tiles (2 x 2: H=64 -2.1%, H=128 -0.9%), not unsplit ones (128 x 2 +0.2 to +0.4%;
// docs/kernel_measured.md).
template <KvLayout L, bool kF16, int kProducerTopk, bool kRopeDirect, bool kLanded = false>
__device__ __forceinline__ void produce_fp8(const DecodeParams& p, const Work& w, uint8_t* smem,
                                            IndexPipe<kProducerTopk>& indices) {
  static_assert(!kRopeDirect || L == KvLayout::fp8_ds_mla, "RoPE chunks: fp8_ds_mla");
  static_assert(!kLanded || kF16, "scores on landed records: kF16");
  constexpr int kNumStages = kStages<L>, kRaws = RawTile<L, kF16>::kBuffers;
  using Rows = Fp8Rows<L, kF16>;
  const int row = producer_row(), part = threadIdx.x % 4;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  uint64_t* empty = full + kNumStages;
  const auto raw_buffer = [smem](int i) { return smem + raw_offset<L, kF16>(i); };
  const auto wait_free = [empty](int n) {  // for tile n's stage
    if (n >= kNumStages) ptx::mbar_wait(&empty[n % kNumStages], ((n / kNumStages) - 1) & 1);
  };
  const auto copy_rope = [&](const RowSource& from, int n) {  // tile n's, once its stage is free
    wait_free(n);
    Rows::copy_rope(from, smem + Smem::kv + n % kNumStages * kTileBytes, row, part);
  };
  if (w.tile_begin >= w.tile_end) return;
  const bool stream = stream_rows<L, kF16>(p);
  // Tile n's records into raw buffer n % kRaws (kLanded: the scores wait for them there).
  const auto copy = [&](const RowSource& from, int n) {
    uint8_t* raw = raw_buffer(n % kRaws);
    if (stream)
      Rows::template copy<true, kRopeDirect>(from, raw, row, part);
    else
      Rows::template copy<false, kRopeDirect>(from, raw, row, part);
    if constexpr (kLanded) {
      uint64_t* landed = &raw_full<L>(smem)[n % kRaws];
      ptx::cp_async_arrive(landed);
      publish_bias(smem, landed, n % kRaws, row, part, from.valid);
    }
  };
  RowSource src =
      row_source(p, w, w.tile_begin * kTileColumns + row, indices.pop(p, w, smem, w.tile_begin));
  copy(src, 0);
  if constexpr (kRopeDirect) copy_rope(src, 0);
  ptx::cp_async_commit();
  int n = 0;
  for (int tile = w.tile_begin; tile < w.tile_end; ++tile, ++n) {
    const bool valid = src.valid;
    if (tile + 1 < w.tile_end) {
      src = row_source(p, w, (tile + 1) * kTileColumns + row, indices.pop(p, w, smem, tile + 1));
      if constexpr (kF16)
        if (n + 1 >= kRaws)
          ptx::mbar_wait(&raw_bars<L>(smem)[(n + 1) % kRaws], ((n + 1) / kRaws - 1) & 1);
      copy(src, n + 1);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // tile n's copies have landed (kRopeDirect: its RoPE too)
    const int stage = n % kNumStages;
    if constexpr (!kRopeDirect) wait_free(n);
    Rows::template convert<kRopeDirect>(raw_buffer(n % kRaws),
                                        smem + Smem::kv + stage * kTileBytes, row, part);
    ptx::fence_proxy_async();  // st.shared (and the RoPE cp.async), then wgmma reads
    ptx::mbar_arrive(&full[stage]);
    if constexpr (!kLanded) publish_bias(smem, &full[stage], stage, row, part, valid);
    if constexpr (kRopeDirect) {  // waited for with tile n + 2's raw copies
      if (tile + 1 < w.tile_end) copy_rope(src, n + 1);
      ptx::cp_async_commit();
    }
  }
}

}  // namespace smla::cuda
