// The decode producer's fp8_ds_mla dequantization (e4m3 bytes times a UE8M0 scale, in bf16
// arithmetic) against the CPU's float product rounded once to bf16: every finite e4m3 code
// under every UE8M0 byte, bit for bit, in warps whose lanes share one scale and in warps that
// mix scales past bf16's reach (the two-multiply path) with ordinary ones.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bitset>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/fp8_convert.cuh"
#include "device_case.h"
#include "ref_numeric.h"

namespace smla::test {
namespace {

constexpr int kCodes = 256, kScales = 256;

// Thread t converts the eight codes 8 (t % 32) .. under scale byte u(t): out[t][8].
__global__ void dequant_kernel(bool mixed, uint32_t* u_of, uint4* out) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x, lane = t % 32;
  const uint32_t u = mixed ? (t * 37 + t / 32) % kScales : t / 32 % kScales;
  uint32_t word[2];
  for (int w = 0; w < 2; ++w)
    word[w] = (8 * lane + 4 * w) | (8 * lane + 4 * w + 1) << 8 | (8 * lane + 4 * w + 2) << 16 |
              (8 * lane + 4 * w + 3) << 24;
  const cuda::Bf16Scale s = cuda::bf16_scale(u);
  u_of[t] = u;
  out[t] = __any_sync(~0u, u > cuda::kOneFactor) ? cuda::e4m3x8_scaled<true>(word[0], word[1], s)
                                                  : cuda::e4m3x8_scaled<false>(word[0], word[1], s);
}

TEST(GpuDequant, Fp8DsMlaCodesTimesEveryScaleAsTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr int kThreads = kScales * kCodes / 8;  // every (scale, code) pair in either mode
  for (bool mixed : {false, true}) {
    DeviceMemory d_u(kThreads * sizeof(uint32_t)), d_out(kThreads * sizeof(uint4));
    ASSERT_CUDA(cudaMemset(d_out.get(), 0xab, d_out.bytes()));  // poison
    dequant_kernel<<<kThreads / 256, 256>>>(mixed, static_cast<uint32_t*>(d_u.get()),
                                            static_cast<uint4*>(d_out.get()));
    ASSERT_CUDA(cudaGetLastError());
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint32_t> u(kThreads);
    std::vector<uint16_t> out(kThreads * 8);
    ASSERT_CUDA(cudaMemcpy(u.data(), d_u.get(), d_u.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(out.data(), d_out.get(), d_out.bytes(), cudaMemcpyDeviceToHost));
    std::bitset<kScales * kCodes> seen;  // (scale, code) pairs checked
    int twice = 0;
    for (int t = 0; t < kThreads; ++t) {
      twice += u[t] > cuda::kOneFactor;
      for (int i = 0; i < 8; ++i) {
        const uint8_t code = uint8_t(8 * (t % 32) + i);
        if ((code & 0x7f) == 0x7f) continue;  // NaN codes: documented as +-480 on CUDA
        // The exact product (in double, from the formats' definitions, not the library's), rounded
        // once to bf16 (through float, which holds it exactly below 2^128; inf past it, as bf16's
        // rounding would give).
        const uint16_t want = to_bf16(ref_e4m3(code) * ref_ue8m0(uint8_t(u[t])));
        const uint16_t got = out[size_t(t) * 8 + i];
        if ((want & 0x7fff) > 0x7f80) {
          ASSERT_GT(got & 0x7fff, 0x7f80) << "code " << int(code) << " scale " << u[t];
        } else {
          ASSERT_EQ(got, want) << "code " << int(code) << " scale byte " << u[t]
                               << (mixed ? " (mixed warp)" : "");
        }
        seen.set(u[t] * kCodes + code);
      }
    }
    EXPECT_EQ(seen.count(), size_t{kScales} * (kCodes - 2)) << "pairs not every (scale, code)";
    EXPECT_GT(twice, 0);
  }
}

}  // namespace
}  // namespace smla::test
