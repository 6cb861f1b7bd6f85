// The decode kernel's producer warpgroup: gathers each tile's KV rows into shared memory.
#pragma once
#include "cuda/decode_layout.cuh"

namespace smla::cuda {

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

}  // namespace smla::cuda
