// How fast the tensor pipe runs the decode kernel's wgmma shapes with nothing else in the way:
// each active consumer warpgroup of a 384-thread CTA (one a SM, 132 CTAs) repeats a fixed
// sequence of wgmma from and into shared memory the layout's way, commits and waits. It prints
// SM cycles per iteration (median over CTAs) against the MAC cycles of the sequence (2048 bf16
// MAC a cycle and SM), so that what a wgmma group costs beyond its MACs is measured, not guessed.
//   smla_wgmma_probe       prints one line per sequence and number of active warpgroups
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/check.h"
#include "cuda/decode_consumer.cuh"
#include "cuda/ptx.cuh"
#include "probe_main.h"

namespace {
using namespace smla::cuda;

constexpr int kCtas = 132, kIters = 2000, kChunk = 8192;  // K/V chunks: 64 rows x 64 dims
constexpr int kQ = 0, kKv = 8 * kChunk, kSmem = 16 * kChunk + 1024;

enum Seq {
  kS32,
  kS32Groups,
  kS32RegFirst,
  kS32RegSpread,
  kS64,
  kPv32,
  kTile32,
  kTile32Wait,
  kTile32RegFirst,
  kTile32RegSpread,
  kTile64,
  kTile64Wait,
  kSeqs
};
// Score steps with Q from registers (A operand RS), 11 of 32 (the bf16 kernels' count until the
// sixty-eighth session: now 10, or 13 reading the query by TMA): none, the first 11 (the kernels
// until the sixty-third session), or spread over the steps as the kernels spread theirs.
enum RegSteps { kNoRegs, kRegsFirst, kRegsSpread };
constexpr int kRegSteps = 11;
using Spread = ConsumerCore<4, false, kRegSteps>;
struct SeqInfo {
  const char* name;
  int score_n, pv_steps;  // 32 score m64n{score_n}k16 (0: none), pv_steps m64n256k16
  RegSteps regs;
  double macs() const { return 32.0 * 64 * score_n * 16 + pv_steps * 64.0 * 256 * 16; }
};
constexpr SeqInfo kSeqInfo[] = {{"scores n32 (32 x m64n32k16)", 32, 0, kNoRegs},
                                {"scores n32, 4 groups of 8 + waits", 32, 0, kNoRegs},
                                {"scores n32, first 11 Q from regs", 32, 0, kRegsFirst},
                                {"scores n32, 11 spread Q from regs", 32, 0, kRegsSpread},
                                {"scores n64 (32 x m64n64k16)", 64, 0, kNoRegs},
                                {"P.V 2 tiles (4 x m64n256k16 RS)", 0, 4, kNoRegs},
                                {"n32 step: scores, P.V 2 tiles", 32, 4, kNoRegs},
                                {"n32 step, wait between", 32, 4, kNoRegs},
                                {"n32 step, first 11 Q from regs", 32, 4, kRegsFirst},
                                {"n32 step, 11 spread Q from regs", 32, 4, kRegsSpread},
                                {"n64 step: scores, P.V 2 x 64 rows", 64, 8, kNoRegs},
                                {"n64 step, wait between", 64, 8, kNoRegs}};

#define F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define F16(i) F4(i), F4(i + 4), F4(i + 8), F4(i + 12)
__device__ __forceinline__ void m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b, bool acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : F16(0), F16(16)
      : "l"(a), "l"(b), "r"(static_cast<int>(acc)));
}
#undef F4
#undef F16

struct Regs {
  float s32[16], s64[32], o[128];
  uint32_t p[4], qa[kRegSteps][4];
};

// Step k's register slot, or -1 where Q comes from shared memory.
__host__ __device__ constexpr int reg_slot(RegSteps regs, int k) {
  return regs == kRegsFirst ? (k < kRegSteps ? k : -1)
         : regs == kRegsSpread ? Spread::reg_slot(k)
                               : -1;
}

// Scores of 32 (or 64) KV rows over all 512 dims: A = Q, B = K, both K-major. They accumulate
// across iterations: a chain restarted each iteration is dead but for the last, and ptxas drops
// the dead copies of a loop it unrolls.
template <int kN, RegSteps kRegs = kNoRegs>
__device__ __forceinline__ void scores(Regs& r, uint64_t q, uint64_t k, int first, int count) {
  ptx::wgmma_fence();
#pragma unroll
  for (int i = first; i < first + count; ++i) {
    const uint64_t a = q + ptx::desc_offset((i / 4) * kChunk + (i % 4) * 32);
    const uint64_t b = k + ptx::desc_offset((i / 4) * kChunk + (i % 4) * 32);
    if constexpr (kN == 32) {
      if (reg_slot(kRegs, i) >= 0)
        ptx::wgmma_m64n32k16_rs(r.s32, r.qa[reg_slot(kRegs, i)], b, true);
      else
        ptx::wgmma_m64n32k16_ss(r.s32, a, b, true);
    } else {
      m64n64k16_ss(r.s64, a, b, true);
    }
  }
  ptx::wgmma_commit();
}

// P.V over 256 dims, `steps` k16 steps of V read N-major.
__device__ __forceinline__ void pv(Regs& r, uint64_t v, int steps) {
  ptx::fence_operands(r.o);
  ptx::wgmma_fence();
  for (int k = 0; k < steps; ++k)
    ptx::wgmma_m64n256k16_rs<false>(r.o, r.p, v + ptx::desc_offset((k % 4) * 16 * 128));
  ptx::wgmma_commit();
}

template <Seq kSeq>
__global__ void __launch_bounds__(384, 1) probe(int active, unsigned long long* cycles,
                                                unsigned long long* ns, float* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  for (int i = threadIdx.x; i < 16 * kChunk / 4; i += blockDim.x)  // small bf16 pairs, not 0
    reinterpret_cast<uint32_t*>(smem)[i] = ((i * 2654435761u) >> 3 & 0x007F007Fu) | 0x3C003C00u;
  ptx::fence_proxy_async();
  __syncthreads();
  const int wg = threadIdx.x / 128 - 1, tid = threadIdx.x % 128;
  if (wg < 0) {
    ptx::reg_dealloc<40>();
    return;
  }
  ptx::reg_alloc<232>();
  if (wg >= active) return;
  Regs r;
  for (int i = 0; i < 16; ++i) r.s32[i] = 0.f;
  for (int i = 0; i < 32; ++i) r.s64[i] = 0.f;
  for (int i = 0; i < 128; ++i) r.o[i] = 0.f;
  for (int i = 0; i < 4; ++i) r.p[i] = 0x3C003C00u + tid;
  for (int j = 0; j < kRegSteps; ++j)
    for (int i = 0; i < 4; ++i) r.qa[j][i] = 0x3C003C00u + tid + j;
  const uint32_t base = ptx::smem_addr(smem);
  ptx::named_sync(1, 128 * active);
  unsigned long long t0, t1, g0, g1;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(g0));
  t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    // Descriptors made in the loop from an opaque base: hoisted, the 64 of a score chain spill.
    const uint32_t at = ptx::opaque(int(base));
    const uint64_t q = ptx::sw128_desc(at + kQ, 16, 1024);
    const uint64_t k = ptx::sw128_desc(at + kKv, 16, 1024);
    const uint64_t v = ptx::sw128_desc(at + kKv + wg * 4 * kChunk, kChunk, 1024);
    constexpr SeqInfo kInfo = kSeqInfo[kSeq];
    if constexpr (kSeq == kS32Groups) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        scores<32>(r, q, k, 8 * g, 8);
        ptx::wgmma_wait<0>();
      }
    } else {
      if constexpr (kInfo.score_n > 0) scores<kInfo.score_n, kInfo.regs>(r, q, k, 0, 32);
      if constexpr (kSeq == kTile32Wait || kSeq == kTile64Wait) ptx::wgmma_wait<0>();
      if constexpr (kInfo.pv_steps > 0) pv(r, v, kInfo.pv_steps);
    }
    ptx::wgmma_wait<0>();
    // Only what the sequence uses: a live idle accumulator would cost the qa registers.
    if constexpr (kInfo.score_n == 32) ptx::fence_operands(r.s32);
    if constexpr (kInfo.score_n == 64) ptx::fence_operands(r.s64);
    if constexpr (kInfo.pv_steps > 0) ptx::fence_operands(r.o);
  }
  t1 = clock64();
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(g1));
  float acc = 0.f;
  for (int i = 0; i < 16; ++i) acc += r.s32[i];
  for (int i = 0; i < 32; ++i) acc += r.s64[i];
  for (int i = 0; i < 128; ++i) acc += r.o[i];
  if (acc == 1234.5f) sink[0] = acc;  // keeps the results live
  if (tid == 0) {
    cycles[blockIdx.x * 2 + wg] = t1 - t0;
    ns[blockIdx.x * 2 + wg] = g1 - g0;
  }
}

template <Seq kSeq>
void run(unsigned long long* cycles, unsigned long long* ns, float* sink) {
  SMLA_CUDA_CHECK(cudaFuncSetAttribute(probe<kSeq>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSmem));
  for (int active = 1; active <= 2; ++active) {
    std::vector<unsigned long long> c(kCtas * 2), t(kCtas * 2);
    for (int rep = 0; rep < 2; ++rep) {  // the first warms the clocks up
      probe<kSeq><<<kCtas, 384, kSmem>>>(active, cycles, ns, sink);
      SMLA_CUDA_CHECK(cudaGetLastError());
      SMLA_CUDA_CHECK(cudaDeviceSynchronize());
    }
    SMLA_CUDA_CHECK(cudaMemcpy(c.data(), cycles, c.size() * 8, cudaMemcpyDeviceToHost));
    SMLA_CUDA_CHECK(cudaMemcpy(t.data(), ns, t.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<unsigned long long> cc, tt;
    for (int i = 0; i < kCtas; ++i) cc.push_back(c[i * 2]), tt.push_back(t[i * 2]);
    std::sort(cc.begin(), cc.end());
    std::sort(tt.begin(), tt.end());
    const double per_iter = double(cc[kCtas / 2]) / kIters;
    const double macs = kSeqInfo[kSeq].macs() * active;
    const double mac_cycles = macs / 2048.0;
    const double tflops = macs * 2 * kCtas * kIters / (tt[kCtas / 2] * 1e3);
    std::printf("%-36s %d WG  %8.1f cycles/iter  MAC cycles %7.1f  pipe %5.1f%%  %.2f GHz"
                "  %6.1f TFLOP/s\n",
                kSeqInfo[kSeq].name, active, per_iter, mac_cycles, 100.0 * mac_cycles / per_iter,
                double(cc[kCtas / 2]) / double(tt[kCtas / 2]), tflops);
  }
}

template <int... kS>
void run_all(std::integer_sequence<int, kS...>, unsigned long long* c, unsigned long long* n,
             float* s) {
  (run<static_cast<Seq>(kS)>(c, n, s), ...);
}

}  // namespace

int run_probe() {
  unsigned long long *cycles, *ns;
  float* sink;
  SMLA_CUDA_CHECK(cudaMalloc(&cycles, kCtas * 2 * sizeof(unsigned long long)));
  SMLA_CUDA_CHECK(cudaMalloc(&ns, kCtas * 2 * sizeof(unsigned long long)));
  SMLA_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  run_all(std::make_integer_sequence<int, kSeqs>{}, cycles, ns, sink);
  return 0;
}

int main(int argc, char** argv) {
  return smla::bench::probe_main(
      argc, argv,
      "SM cycles per iteration of the decode kernel's wgmma sequences, one or both consumer\n"
      "warpgroups, against their MAC cycles.",
      run_probe);
}
