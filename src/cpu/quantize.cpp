#include "cpu/quantize.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/quantize_rules.h"
#include "cpu/fp_mode.h"
#include "cpu/parallel.h"

namespace smla::cpu {
namespace {

constexpr int64_t kRowsPerTask = 256;  // a decode step's few rows stay on the caller's thread

void encode_e4m3(const uint16_t* x, float kv_scale, uint8_t* out) {
  for (int d = 0; d < kHeadDim; ++d) out[d] = rules::e4m3_per_tensor(x[d], kv_scale);
}

// 576-B record: NoPE e4m3 under per-group scales, RoPE bf16 bits; 8-B scale record.
void encode_ds_mla(const uint16_t* x, uint8_t* record, uint8_t* scales) {
  for (int g = 0; g < kNopeDim / kDsMlaGroup; ++g) {
    uint16_t max_magnitude = 0;
    for (int d = g * kDsMlaGroup; d < (g + 1) * kDsMlaGroup; ++d)
      max_magnitude = std::max(max_magnitude, rules::scale_magnitude(x[d]));
    const uint8_t e = rules::ds_mla_group_exponent(max_magnitude);
    const float inverse = rules::ds_mla_inverse_scale(e);
    for (int d = g * kDsMlaGroup; d < (g + 1) * kDsMlaGroup; ++d)
      record[d] = rules::ds_mla_e4m3(x[d], inverse);
    scales[g] = e;
  }
  scales[kNopeDim / kDsMlaGroup] = 0;  // the pad byte
  std::memcpy(record + kNopeDim, x + kNopeDim, kRopeDim * sizeof(uint16_t));
}

}  // namespace

void quantize_kv(const QuantizeProblem& p, const TensorView& rows, const TensorView& slots) {
  const KvPool& pool = p.pool;
  auto write = [&](int64_t i) {
    const int32_t slot = check::at(slots, i);
    // Padding; or a slot changed by another thread since validation: never written out of bounds.
    if (slot < 0 || slot >= pool.slots()) return;
    const uint16_t* x = rows.ptr<const uint16_t>() + i * rows.stride(0);
    const int64_t offset = pool.slot_offset(slot);
    // KvPool keeps the decode op's read-only view; the pool tensor itself is writable.
    auto* record = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(pool.row(offset)));
    switch (pool.layout) {
      case KvLayout::bf16:
        std::memcpy(record, x, kHeadDim * sizeof(uint16_t));
        break;
      case KvLayout::fp8_e4m3:
        encode_e4m3(x, p.kv_scale, record);
        break;
      case KvLayout::fp8_ds_mla:
        encode_ds_mla(x, record, const_cast<uint8_t*>(pool.ds_mla_scales(offset)));
        break;
    }
  };
  parallel_ranges((p.num_rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t begin, int64_t end) {
    const IeeeDefaultMode ieee;  // on each worker thread: the floats round as on the GPU
    for (int64_t i = begin * kRowsPerTask; i < std::min(p.num_rows, end * kRowsPerTask); ++i)
      write(i);
  });
}

}  // namespace smla::cpu
