// A validated decode call: sizes and pool geometry derived once, shared by both backends.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/host_device.h"
#include "smla/decode.h"

namespace smla {

// Geometry of one KV pool. Offsets index rows: row o lives in page o / span at slot o % span;
// slots >= block_size of a page hold packed data of others and are never read. Its methods run
// on the device too (the CUDA quantizer writes where the CPU one does).
struct KvPool {
  KvLayout layout = KvLayout::bf16;
  const std::byte* base = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;          // token rows per page
  int64_t span = 0;                // block stride / token stride (fp8_ds_mla: block_size)
  int64_t token_stride_bytes = 0;  // fp8_ds_mla: kDsMlaRecordBytes
  int64_t block_stride_bytes = 0;

  SMLA_HOST_DEVICE int64_t rows() const { return num_blocks * span; }
  // SPEC §4 slots: the real rows.
  SMLA_HOST_DEVICE int64_t slots() const { return num_blocks * block_size; }
  // SPEC §4: the storage offset of slot `slot` in [0, slots()).
  SMLA_HOST_DEVICE int64_t slot_offset(int64_t slot) const {
    return slot / block_size * span + slot % block_size;
  }
  SMLA_HOST_DEVICE bool valid(int64_t offset) const {
    return offset >= 0 && offset < rows() && offset % span < block_size;
  }
  // Start of row `offset`'s record (valid offsets only).
  SMLA_HOST_DEVICE const std::byte* row(int64_t offset) const {
    return base + (offset / span) * block_stride_bytes + (offset % span) * token_stride_bytes;
  }
  // fp8_ds_mla: the 8 scale bytes of row `offset`.
  SMLA_HOST_DEVICE const uint8_t* ds_mla_scales(int64_t offset) const {
    return reinterpret_cast<const uint8_t*>(base + (offset / span) * block_stride_bytes +
                                            block_size * kDsMlaRecordBytes +
                                            (offset % span) * kDsMlaScaleBytes);
  }
};

// Bytes a token row of `layout` occupies in its pool (fp8_ds_mla: the record and its scales).
constexpr int64_t kv_row_bytes(KvLayout layout) {
  return layout == KvLayout::bf16       ? 2 * kHeadDim
         : layout == KvLayout::fp8_e4m3 ? kHeadDim
                                        : kDsMlaRecordBytes + kDsMlaScaleBytes;
}

struct DecodeProblem {
  int64_t num_tokens = 0;    // T
  int64_t num_requests = 0;  // B
  int64_t num_columns = 0;   // K (with topk_columns: the width of the table it stands for)
  bool topk_columns = false; // columns >= W come from args.topk_columns, not the table
  int64_t top_k = 0;         // topk_columns' width
  int num_heads = 0;         // H
  int out_heads = 0;         // H_out
  int window = kWindow;      // W
  KvLayout layout = KvLayout::bf16;
  DType query_dtype = DType::bf16;
  Device device;
  KvPool swa, compressed;
};

// Checks every argument (dtype, device, shape, strides, values readable on the host) and
// throws smla::Error naming the first bad one.
DecodeProblem validate_decode(const DecodeArgs& args);

// Geometry of a pool argument named `name`; throws smla::Error when it is not a valid pool.
KvPool make_pool(const TensorView& pool, const char* name);

// For overlap checks (check::apart) beside the view itself: the bytes of an fp8_ds_mla pool's
// pages that hold records, the first block_size * 584 of each page whatever the view's token
// stride says (a stride past 584 B leaves bytes between the view's rows that are read and
// written). Absent for the other layouts, whose view's rows are those bytes.
TensorView pool_records(const TensorView& view, const KvPool& pool);

}  // namespace smla
