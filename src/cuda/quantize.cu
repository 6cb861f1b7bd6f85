// The CUDA quantizer: one warp per row, its lanes over the row's values (fp8_ds_mla: a group's
// largest finite |x| by a warp reduction). Every byte comes from the encoders the CPU quantizer
// uses (core/quantize_rules.h) at the address KvPool gives it, so the pools agree bit for bit.
#include "cuda/quantize.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/quantize_rules.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace smla::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerCta = 4;
constexpr int kThreads = kWarp * kRowsPerCta;
constexpr unsigned kAllLanes = 0xffffffffu;

struct QuantizeParams {
  const uint16_t* rows;  // bf16 bits
  int64_t row_stride;    // elements
  const int32_t* slots;
  int64_t slot_stride;
  int64_t num_rows;
  float kv_scale;
  KvPool pool;
};

__device__ void write_bf16(const uint16_t* x, uint8_t* record, int lane) {
  auto* out = reinterpret_cast<uint16_t*>(record);  // checked on the host: 2-byte aligned
  for (int d = lane; d < kHeadDim; d += kWarp) out[d] = x[d];
}

__device__ void write_e4m3(const uint16_t* x, float kv_scale, uint8_t* record, int lane) {
  for (int d = lane; d < kHeadDim; d += kWarp) record[d] = rules::e4m3_per_tensor(x[d], kv_scale);
}

// The whole warp runs it (the reduction needs every lane).
__device__ void write_ds_mla(const uint16_t* x, uint8_t* record, uint8_t* scales, int lane) {
  for (int g = 0; g < kNopeDim / kDsMlaGroup; ++g) {
    const int d0 = g * kDsMlaGroup + lane, d1 = d0 + kWarp;
    const unsigned local =
        max(unsigned{rules::scale_magnitude(x[d0])}, unsigned{rules::scale_magnitude(x[d1])});
    const auto max_magnitude = static_cast<uint16_t>(__reduce_max_sync(kAllLanes, local));
    const uint8_t e = rules::ds_mla_group_exponent(max_magnitude);
    const float inverse = rules::ds_mla_inverse_scale(e);
    record[d0] = rules::ds_mla_e4m3(x[d0], inverse);
    record[d1] = rules::ds_mla_e4m3(x[d1], inverse);
    if (lane == 0) scales[g] = e;
  }
  if (lane == 0) scales[kNopeDim / kDsMlaGroup] = 0;  // the pad byte
  // RoPE: the bf16 bits, little-endian, byte by byte (a u8 pool may start at any address).
  for (int d = kNopeDim + lane; d < kHeadDim; d += kWarp) {
    uint8_t* out = record + kNopeDim + 2 * (d - kNopeDim);
    out[0] = static_cast<uint8_t>(x[d]);
    out[1] = static_cast<uint8_t>(x[d] >> 8);
  }
}

__global__ void __launch_bounds__(kThreads) quantize_kv_kernel(const QuantizeParams p) {
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();  // the rows, and the pool's bytes, may be written until now
  const int64_t i = int64_t{blockIdx.x} * kRowsPerCta + threadIdx.x / kWarp;
  if (i >= p.num_rows) return;  // the whole warp: one row per warp
  const int32_t slot = p.slots[i * p.slot_stride];
  // Padding, or a slot past the pool that the host could not see: the warp writes nothing.
  if (slot < 0 || slot >= p.pool.slots()) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const uint16_t* x = p.rows + i * p.row_stride;
  const int64_t offset = p.pool.slot_offset(slot);
  // KvPool keeps the decode op's read-only view; the pool tensor itself is writable.
  auto* record = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(p.pool.row(offset)));
  switch (p.pool.layout) {
    case KvLayout::bf16:
      write_bf16(x, record, lane);
      break;
    case KvLayout::fp8_e4m3:
      write_e4m3(x, p.kv_scale, record, lane);
      break;
    case KvLayout::fp8_ds_mla:
      write_ds_mla(x, record, const_cast<uint8_t*>(p.pool.ds_mla_scales(offset)), lane);
      break;
  }
}

}  // namespace

const void* quantize_kernel() { return reinterpret_cast<const void*>(&quantize_kv_kernel); }

void quantize_kv(const QuantizeProblem& problem, const TensorView& rows, const TensorView& slots,
                 void* stream) {
  require_usable(problem.device, "pool");
  if (problem.num_rows == 0) return;
  const int64_t ctas = (problem.num_rows + kRowsPerCta - 1) / kRowsPerCta;
  require(ctas <= INT32_MAX, "rows", "at most 2^31 - 1 CTAs of 4 rows on CUDA",
          [&] { return std::to_string(problem.num_rows) + " rows"; });

  QuantizeParams p{};
  p.rows = rows.ptr<const uint16_t>();
  p.row_stride = rows.stride(0);
  p.slots = slots.ptr<const int32_t>();
  p.slot_stride = slots.stride(0);
  p.num_rows = problem.num_rows;
  p.kv_scale = problem.kv_scale;
  p.pool = problem.pool;
  launch_early("the quantize kernel", quantize_kv_kernel, dim3(static_cast<unsigned>(ctas)),
               dim3(kThreads), 0, static_cast<cudaStream_t>(stream), 1, p);
}

}  // namespace smla::cuda
