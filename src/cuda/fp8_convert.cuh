// fp8 values to 16-bit floats in registers, exact: per-tensor e4m3 to f16 or bf16, and
// fp8_ds_mla's e4m3 times a UE8M0 scale to bf16 in bf16 arithmetic. The decode producer's
// conversions; tests/gpu/test_dequant_gpu.cu checks every code under every scale.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx.cuh"

namespace smla::cuda {

// Eight per-tensor e4m3 values (two words) -> eight f16 (kF16) or eight bf16 (16 bytes), exact.
template <bool kF16>
__device__ __forceinline__ uint4 e4m3x8_to(uint32_t lo, uint32_t hi) {
  uint32_t out[4];
  const uint2 halves[2] = {ptx::e4m3x4_to_f16x4(lo), ptx::e4m3x4_to_f16x4(hi)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t h = i % 2 ? halves[i / 2].y : halves[i / 2].x;
    if constexpr (kF16) {
      out[i] = h;
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      out[i] = *reinterpret_cast<uint32_t*>(&b);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A UE8M0 byte u as the bf16 factor of e4m3x8_scaled: 2^(u - 7), or where that is past bf16
// (u > kOneFactor, the largest u whose 2^(u - 7) is a bf16) 2^127 and then `second` =
// 2^(u - 134) (u = 255 too: 2^128 in all, so that a zero code stays 0).
constexpr uint32_t kOneFactor = 127 + 7;
struct Bf16Scale {
  uint32_t first, second;  // bf16x2 bits, the factor in both halves
};
__device__ __forceinline__ Bf16Scale bf16_scale(uint32_t u) {
  const bool big = u > kOneFactor;
  const uint32_t both = 0x00800080u;  // 1 in both halves' exponent fields
  return {big ? 0x7f007f00u : (u + 120) * both,
          !big ? 0x3f803f80u : (u - 7) * both};
}

// Eight e4m3 values (two words) times 2^(u - 127) -> eight bf16, in bf16 arithmetic: a byte's
// sign and low seven bits moved to bits 15 and 4..10 of a half are the bf16 of its value times
// 2^-120 (subnormals included), so one bf16 multiply rounds value * 2^(u - 127) once, as
// rounding the exact float product would: exact unless it leaves bf16's range (above it inf;
// below 2^-133, UE8M0 bytes 0..2 with e4m3 subnormals, a bf16 subnormal or 0, where the CPU's
// float64 keeps the value). The NaN codes 0x7F / 0xFF read as +-480 (on the CPU NaN); the
// quantizer writes them only under the scale byte 255, so they become +-inf.
template <bool kTwice>
__device__ __forceinline__ uint4 e4m3x8_scaled(uint32_t lo, uint32_t hi, const Bf16Scale& s) {
  uint32_t out[4];
  const uint32_t words[2] = {lo, hi};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Each half holds its byte under a byte of copies of the byte's sign bit (prmt's sign
    // mode); shifted by 4 and masked, the sign is bit 15 and the low seven bits are 4..10.
    const uint32_t x = ptx::prmt(words[i / 2], 0, i % 2 ? 0xb3a2 : 0x9180);
    const uint32_t bits = (x << 4) & 0x87f087f0u;
    __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                               *reinterpret_cast<const __nv_bfloat162*>(&s.first));
    if constexpr (kTwice) v = __hmul2(v, *reinterpret_cast<const __nv_bfloat162*>(&s.second));
    out[i] = *reinterpret_cast<uint32_t*>(&v);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace smla::cuda
