// How fast a cluster reduces split rows through distributed shared memory, as the decode
// kernel's `finish_cluster` does: each CTA of a cluster of `splits` stages `heads` bf16 output
// rows (kOutPitch apart), then after a cluster barrier owns one `splits`-th of the rows' 16-byte
// chunks and reads each of them from every CTA of the cluster, sums them in split order and
// writes them out. Variants of the read: the kernel's (every peer's chunk loaded, then summed),
// the peers visited from the next rank on, two chunks a pass, and as baselines every load
// from the CTA's own shared memory (through `mapa`, and plain), and mixed: a share of the chunks
// (k of every 8) staged to global memory and read back from L2 beside the others' peer reads,
// to see whether the two paths into an SM add up. 256 threads a CTA (the consumer warpgroups)
// and enough shared memory that one CTA runs per SM.
// Then what one synchronization of a cluster's CTAs costs: `barrier.cluster` (release /
// acquire, and relaxed) against each CTA arriving on every peer's mbarrier (release at cluster
// scope, one thread after a CTA barrier) and waiting on its own.
//   smla_dsmem_probe   prints, per variant and shape, the medians over CTAs of staging plus the
//                      cluster barrier and of the read phase, the reads' bytes per microsecond,
//                      and checks every output chunk; then each synchronization's median cost
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/check.h"
#include "cuda/decode_layout.cuh"
#include "cuda/launch.h"
#include "probe_main.h"

namespace {
using namespace smla::cuda;

enum Read { kPeers, kRotated, kTwoChunks, kOwnMapa, kOwnPlain, kMixed };
constexpr int kProbeThreads = 256, kMaxSplits8 = 8, kProbeSmem = 200 * 1024;

struct ProbeArgs {
  int heads, repeats;
  uint4* out;                  // [cta / splits][heads][kRowChunks]
  uint4* staged;               // [cta][heads][kRowChunks]: kMixed's chunks through L2
  unsigned long long* stamps;  // [cta][3]: barrier passed, reads done, end (ns from staging)
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// The value of element k of chunk `unit` of row `row` in CTA `rank`: small integers, so that
// sums of up to eight are exact in float and bf16.
__host__ __device__ constexpr int element(int rank, int row, int unit, int k) {
  return (3 * rank + row + unit + k) % 16;
}

template <Read kRead>
__device__ __forceinline__ uint4 load(const uint4* at, int rank) {
  if constexpr (kRead == kOwnPlain) return *at;
  const int from = kRead == kOwnMapa ? int(cluster_rank()) : rank;
  return *ptx::cluster_map(at, from);
}

// kMixed: chunk i goes through L2 when i % 8 < kL2Eighths (whole threads, as 8 divides the
// CTA's thread count, so both paths have loads in flight at once).
template <int kL2Eighths>
__device__ __forceinline__ bool through_l2(int i) {
  return i % 8 < kL2Eighths;
}

template <Read kRead, int kL2Eighths = 0>
__device__ __forceinline__ uint4 reduce_chunk(const uint8_t* smem, const uint4* staged, int chunks,
                                              int i, int splits, int me) {
  const int row = i / kRowChunks, unit = i % kRowChunks;
  const uint4* at = reinterpret_cast<const uint4*>(smem + row * kOutPitch) + unit;
  const bool l2 = kRead == kMixed && through_l2<kL2Eighths>(i);
  // kRotated sums in the order it loads (exact for the probe's small integers; in the kernel
  // still the same order every launch, as a chunk's owner is fixed).
  uint4 v[kMaxSplits8];
#pragma unroll
  for (int s = 0; s < kMaxSplits8; ++s)
    if (s < splits)
      v[s] = l2 ? __ldcg(staged + int64_t(s) * chunks + i)
                : load<kRead>(at, kRead == kRotated ? (me + 1 + s) % splits : s);
  float2 acc[4] = {};
#pragma unroll
  for (int s = 0; s < kMaxSplits8; ++s)
    if (s < splits) {
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v[s]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        acc[k].x += f.x, acc[k].y += f.y;
      }
    }
  uint4 out;
  auto* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = __floats2bfloat162_rn(acc[k].x, acc[k].y);
  return out;
}

template <Read kRead, int kL2Eighths = 0>
__global__ void __launch_bounds__(kProbeThreads, 1) probe(ProbeArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  ptx::griddep_wait();
  const int splits = int(cluster_size()), me = int(cluster_rank());
  const int chunks = a.heads * kRowChunks;
  const uint4* staged = a.staged + int64_t(blockIdx.x - me) * chunks;
  ptx::cluster_sync();
  const unsigned long long start = now_ns();
  for (int i = threadIdx.x; i < chunks; i += kProbeThreads) {
    const int row = i / kRowChunks, unit = i % kRowChunks;
    uint4 v;
    auto* h = reinterpret_cast<__nv_bfloat16*>(&v);
    for (int k = 0; k < 8; ++k) h[k] = __int2bfloat16_rn(element(me, row, unit, k));
    if (kRead == kMixed && through_l2<kL2Eighths>(i))
      a.staged[int64_t(blockIdx.x) * chunks + i] = v;
    else
      *reinterpret_cast<uint4*>(smem + row * kOutPitch + unit * 16) = v;
  }
  ptx::cluster_sync();
  const unsigned long long passed = now_ns();
  const int begin = me * chunks / splits, end = (me + 1) * chunks / splits;
  uint4* out = a.out + int64_t(blockIdx.x / splits) * chunks;
  for (int r = 0; r < a.repeats; ++r) {
    if constexpr (kRead == kTwoChunks) {
#pragma unroll 1
      for (int i = begin + threadIdx.x; i < end; i += 2 * kProbeThreads) {
        const int j = i + kProbeThreads;
        const uint4 x = reduce_chunk<kPeers>(smem, staged, chunks, i, splits, me);
        if (j < end) out[j] = reduce_chunk<kPeers>(smem, staged, chunks, j, splits, me);
        out[i] = x;
      }
    } else {
#pragma unroll 1
      for (int i = begin + threadIdx.x; i < end; i += kProbeThreads)
        out[i] = reduce_chunk<kRead, kL2Eighths>(smem, staged, chunks, i, splits, me);
    }
  }
  const unsigned long long reads = now_ns();
  ptx::cluster_sync_relaxed();
  if (threadIdx.x == 0) {
    a.stamps[3 * blockIdx.x] = passed - start;
    a.stamps[3 * blockIdx.x + 1] = reads - passed;
    a.stamps[3 * blockIdx.x + 2] = now_ns() - start;
  }
}

enum Sync { kBarrier, kBarrierRelaxed, kPeerArrive };
constexpr int kSyncRounds = 64;

// Arrives on the mbarrier at `bar` (this CTA's shared address) of cluster CTA `rank`.
__device__ __forceinline__ void arrive_on_peer(uint32_t bar, int rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(bar),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// kSyncRounds synchronizations of the cluster; stamps[cta] = ns a round.
template <Sync kSync>
__global__ void __launch_bounds__(kProbeThreads, 1) sync_probe(unsigned long long* stamps) {
  __shared__ uint64_t bar;
  const int splits = int(cluster_size());
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, splits);
    ptx::mbar_init_fence();
  }
  ptx::cluster_sync();
  const unsigned long long start = now_ns();
  for (int r = 0; r < kSyncRounds; ++r) {
    if constexpr (kSync == kBarrier) {
      ptx::cluster_sync();
    } else if constexpr (kSync == kBarrierRelaxed) {
      ptx::cluster_sync_relaxed();
    } else {
      __syncthreads();
      if (threadIdx.x < splits) arrive_on_peer(ptx::smem_addr(&bar), threadIdx.x);
      wait_cluster(ptx::smem_addr(&bar), r & 1);
    }
  }
  const unsigned long long end = now_ns();
  ptx::cluster_sync();  // no CTA exits while a peer may still arrive on its barrier
  if (threadIdx.x == 0) stamps[blockIdx.x] = (end - start) / kSyncRounds;
}

double median_us(std::vector<unsigned long long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1e-3;
}

float bf16_float(uint16_t bits) {
  const uint32_t w = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// Output elements of `clusters` clusters that are not the sum of every CTA's (own: the chunk's
// owner's, `splits` times).
long long check(const uint4* out, int clusters, int heads, int splits, bool own) {
  const int chunks = heads * kRowChunks;
  std::vector<uint16_t> o(size_t(clusters) * chunks * 8);
  SMLA_CUDA_CHECK(cudaMemcpy(o.data(), out, o.size() * sizeof(o[0]), cudaMemcpyDeviceToHost));
  long long wrong = 0;
  for (int i = 0, owner = 0; i < chunks; ++i) {
    while (i >= (owner + 1) * chunks / splits) ++owner;
    for (int e = 0; e < 8; ++e) {
      int want = 0;
      for (int s = 0; s < splits; ++s)
        want += element(own ? owner : s, i / kRowChunks, i % kRowChunks, e);
      for (int c = 0; c < clusters; ++c)
        wrong += bf16_float(o[(size_t(c) * chunks + i) * 8 + e]) != float(want);
    }
  }
  return wrong;
}

}  // namespace

int run_probe() {
  constexpr int kMaxCtas = 132, kMaxHeads = 64;
  uint4 *out, *staged;
  unsigned long long* stamps;
  SMLA_CUDA_CHECK(cudaMalloc(&out, kMaxCtas * kMaxHeads * kRowChunks * sizeof(uint4)));
  SMLA_CUDA_CHECK(cudaMalloc(&staged, kMaxCtas * kMaxHeads * kRowChunks * sizeof(uint4)));
  SMLA_CUDA_CHECK(cudaMalloc(&stamps, kMaxCtas * 3 * sizeof(unsigned long long)));
  const struct {
    void (*kernel)(ProbeArgs);
    const char* name;
    bool own;  // every load from the CTA's own shared memory
  } kernels[] = {{probe<kPeers>, "peers", false},
                 {probe<kRotated>, "rotated", false},
                 {probe<kTwoChunks>, "two chunks", false},
                 {probe<kOwnMapa>, "own mapa", true},
                 {probe<kOwnPlain>, "own plain", true},
                 {probe<kMixed, 2>, "L2 2/8", false},
                 {probe<kMixed, 4>, "L2 4/8", false},
                 {probe<kMixed, 8>, "L2 8/8", false}};
  for (const auto& k : kernels) {
    SMLA_CUDA_CHECK(
        cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeSmem));
  }
  printf("%-11s %6s %5s %4s %7s | %8s %8s %8s | %s\n", "read", "splits", "heads", "ctas",
         "repeats", "stage us", "reads us", "end us", "bytes a CTA per us (reads)");
  long long wrong = 0;
  for (const int heads : {32, 64})
    for (const int splits : {2, 4, 7, 8})
      for (const int ctas : {56 / splits * splits, 112 / splits * splits})
        for (const int repeats : {1, 4})
          for (const auto& k : kernels) {
            std::vector<unsigned long long> stages, reads, ends;
            for (int rep = 0; rep < 6; ++rep) {  // rep 0 warms up
              SMLA_CUDA_CHECK(cudaMemset(out, 0xff, ctas / splits * heads * kRowChunks * 16));
              launch_early("the DSMEM probe", k.kernel, dim3(ctas), dim3(kProbeThreads), kProbeSmem,
                           nullptr, splits, ProbeArgs{heads, repeats, out, staged, stamps});
              SMLA_CUDA_CHECK(cudaDeviceSynchronize());
              std::vector<unsigned long long> s(3 * ctas);
              SMLA_CUDA_CHECK(
                  cudaMemcpy(s.data(), stamps, s.size() * sizeof(s[0]), cudaMemcpyDeviceToHost));
              if (rep == 0) continue;
              if (rep == 1) wrong += check(out, ctas / splits, heads, splits, k.own);
              for (int c = 0; c < ctas; ++c) {
                stages.push_back(s[3 * c]);
                reads.push_back(s[3 * c + 1]);
                ends.push_back(s[3 * c + 2]);
              }
            }
            const double us = median_us(reads);
            const double bytes = double(heads) * kRowChunks * 16 * repeats;  // all CTAs' chunks
            printf("%-11s %6d %5d %4d %7d | %8.2f %8.2f %8.2f | %.0f\n", k.name, splits, heads,
                   ctas, repeats, median_us(stages), us, median_us(ends), bytes / us);
          }
  printf("\n%-15s %6s %4s | %s\n", "sync", "splits", "ctas", "ns a synchronization (median)");
  const struct {
    void (*kernel)(unsigned long long*);
    const char* name;
  } syncs[] = {{sync_probe<kBarrier>, "barrier"},
               {sync_probe<kBarrierRelaxed>, "barrier relaxed"},
               {sync_probe<kPeerArrive>, "peer arrivals"}};
  for (const int splits : {2, 4, 7, 8})
    for (const int ctas : {56 / splits * splits, 112 / splits * splits})
      for (const auto& k : syncs) {
        std::vector<unsigned long long> ns;
        for (int rep = 0; rep < 6; ++rep) {  // rep 0 warms up
          launch_early("the cluster sync probe", k.kernel, dim3(ctas), dim3(kProbeThreads), 0,
                       nullptr, splits, stamps);
          SMLA_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<unsigned long long> s(ctas);
          SMLA_CUDA_CHECK(
              cudaMemcpy(s.data(), stamps, s.size() * sizeof(s[0]), cudaMemcpyDeviceToHost));
          if (rep > 0) ns.insert(ns.end(), s.begin(), s.end());
        }
        printf("%-15s %6d %4d | %.0f\n", k.name, splits, ctas, median_us(ns) * 1e3);
      }
  SMLA_CUDA_CHECK(cudaFree(out));
  SMLA_CUDA_CHECK(cudaFree(staged));
  SMLA_CUDA_CHECK(cudaFree(stamps));
  printf("output elements that did not match: %lld\n", wrong);
  return wrong == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  return smla::bench::probe_main(
      argc, argv,
      "How fast a cluster reduces split rows through distributed shared memory (every\n"
      "output chunk checked), then what one cluster synchronization costs.",
      run_probe);
}
