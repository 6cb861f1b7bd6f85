// How fast one CTA's producer warpgroup fills the decode kernel's stages: 32 random 1 KiB rows
// per tile into 128B-swizzled shared memory, consumers that check every byte and release the
// stage. Copies: the kernel's cp.async (16 bytes a lane, eight lanes a row: each instruction
// reads 128 bytes of four rows, with the L2 evict-first policy as at H <= 64) over 2 to 6
// stages, released at once or, as the kernel's seesaw does, a tile or two later (hold); the
// same without the policy; each instruction reading 512 contiguous bytes of one row (a row in
// two, as the gather ceiling's loads); the kernel's pattern by ld.global into registers and
// stores, two tiles in flight; or TMA boxes of one row x 64 dims (the swizzle follows
// the shared-memory address, so a one-row box lands where the kernel's layout wants it) issued
// by one warp or by four.
//   smla_copy_probe        prints the median over CTAs of when tiles were issued and arrived
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>
#include <vector>

#include "cuda/check.h"
#include "cuda/decode_producer.cuh"
#include "cuda/tensor_map.h"
#include "probe_main.h"

namespace {
using namespace smla::cuda;

constexpr int kProbeMaxStages = 6, kMaxTiles = 32, kRowBytes = 1024;
enum Copy { kCpAsync, kCpAsyncPlain, kCpAsyncRowwise, kLoadStore, kTmaOneWarp, kTmaFourWarps };
__host__ __device__ constexpr bool is_cp_async(Copy c) { return c < kLoadStore; }

// kLoadStore: the warp's eight rows as the kernel's copies read them (128 bytes of four rows an
// instruction), but by `ld.global.nc` into registers, stored into the stage once it is free;
// the next tile's loads are issued before this one's stores, so two tiles are in flight.
struct RowRegs {
  uint4 v[16];
  __device__ __forceinline__ void load(const char* row) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const char* record = reinterpret_cast<const char*>(
          __shfl_sync(~0u, reinterpret_cast<uintptr_t>(row), 4 * (4 * g + lane / 8)));
#pragma unroll
      for (int chunk = 0; chunk < 8; ++chunk)
        v[8 * g + chunk] = __ldg(reinterpret_cast<const uint4*>(record) + chunk * 8 + lane % 8);
    }
  }
  __device__ __forceinline__ void store(uint8_t* dst) const {
    const int lane = threadIdx.x % 32, warp_row0 = producer_row() - lane / 4;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int chunk = 0; chunk < 8; ++chunk)
        *reinterpret_cast<uint4*>(dst + chunk * kKvChunkBytes +
                                  swizzle(warp_row0 + 4 * g + lane / 8, lane % 8)) =
            v[8 * g + chunk];
  }
};

// The warp's eight rows (this lane's row at `row`, four lanes a row), each in two instructions
// of 512 contiguous bytes.
__device__ __forceinline__ void copy_rows_rowwise(uint8_t* dst, const char* row) {
  const int lane = threadIdx.x % 32, warp_row0 = producer_row() - lane / 4;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const char* record =
        reinterpret_cast<const char*>(__shfl_sync(~0u, reinterpret_cast<uintptr_t>(row), 4 * r));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = 4 * h + lane / 8;
      ptx::cp_async_16<true>(
          ptx::smem_addr(dst + chunk * kKvChunkBytes + swizzle(warp_row0 + r, lane % 8)),
          record + (chunk * 8 + lane % 8) * 16, true);
    }
  }
}

struct ProbeArgs {
  const char* pool;
  const int* rows;  // [cta][tiles][32]
  int tiles;
  unsigned long long* stamps;  // [cta][2][kMaxTiles]: issued, arrived (ns from start)
  unsigned long long* wrong;   // words that did not match the pool
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// kHold: the consumers release tile n - kHold's stage once tile n is checked, as the kernel's
// seesaw keeps a stage until after the next tile's scores.
template <Copy kCopy, int kProbeStages, int kHold = 0>
__global__ void __launch_bounds__(kThreads, 1)
    probe(const __grid_constant__ CUtensorMap map, ProbeArgs a) {
  static_assert(kProbeStages <= kProbeMaxStages, "room for the stages");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kProbeMaxStages * kTileBytes);
  uint64_t* empty = full + kProbeStages;
  const int* rows = a.rows + blockIdx.x * a.tiles * kTileColumns;
  unsigned long long* stamps = a.stamps + blockIdx.x * 2 * kMaxTiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kProbeStages; ++s) {
      ptx::mbar_init(&full[s], kCopy <= kLoadStore ? 128 : kCopy == kTmaOneWarp ? 1 : 4);
      ptx::mbar_init(&empty[s], 256);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();
  const unsigned long long start = now_ns();
  if (kCopy == kLoadStore && warp < 4) {
    const auto row_of = [&](int n) {
      return a.pool + int64_t(rows[n * kTileColumns + producer_row()]) * kRowBytes;
    };
    const auto put = [&](const RowRegs& r, int n) {  // tile n into its stage
      const int stage = n % kProbeStages;
      if (n >= kProbeStages) ptx::mbar_wait(&empty[stage], (n / kProbeStages - 1) & 1);
      r.store(smem + stage * kTileBytes);
      ptx::mbar_arrive(&full[stage]);
      if (threadIdx.x == 0) stamps[n] = now_ns() - start;
    };
    RowRegs even, odd;
    even.load(row_of(0));
    for (int n = 0; n < a.tiles; n += 2) {  // two register sets, so no index is dynamic
      if (n + 1 < a.tiles) odd.load(row_of(n + 1));
      put(even, n);
      if (n + 1 >= a.tiles) break;
      if (n + 2 < a.tiles) even.load(row_of(n + 2));
      put(odd, n + 1);
    }
  } else if (warp < 4) {
    for (int n = 0; n < a.tiles; ++n) {
      const int stage = n % kProbeStages;
      uint8_t* dst = smem + stage * kTileBytes;
      if (n >= kProbeStages) ptx::mbar_wait(&empty[stage], (n / kProbeStages - 1) & 1);
      if constexpr (is_cp_async(kCopy)) {  // the kernel's own copies, or a variant
        const char* row = a.pool + int64_t(rows[n * kTileColumns + producer_row()]) * kRowBytes;
        if constexpr (kCopy == kCpAsyncRowwise)
          copy_rows_rowwise(dst, row);
        else
          copy_rows_bf16<kCopy != kCpAsyncPlain>(dst, RowSource{true, row, row});
        ptx::cp_async_arrive(&full[stage]);
      } else {
        if (kCopy == kTmaOneWarp && warp != 0) continue;
        constexpr int kRowsPerWarp = kCopy == kTmaOneWarp ? 32 : 8;
        if (lane == 0) ptx::mbar_arrive_expect_tx(&full[stage], kRowsPerWarp * kRowBytes);
        __syncwarp();
        const int r = kCopy == kTmaOneWarp ? lane : warp * 8 + lane / 4;
        const int row = rows[n * kTileColumns + r];
#pragma unroll
        for (int k = 0; k < (kCopy == kTmaOneWarp ? 8 : 2); ++k) {
          const int c = kCopy == kTmaOneWarp ? k : 2 * (lane % 4) + k;
          ptx::tma_load_2d(ptx::smem_addr(dst + c * kKvChunkBytes + r * 128), &map, c * 64, row,
                           &full[stage]);
        }
      }
      if (threadIdx.x == 0) stamps[n] = now_ns() - start;
    }
  } else {
    const int t = threadIdx.x - 128;
    unsigned long long wrong = 0;
    for (int n = 0; n < a.tiles; ++n) {
      const int stage = n % kProbeStages;
      ptx::mbar_wait(&full[stage], (n / kProbeStages) & 1);
      if (t == 0) stamps[kMaxTiles + n] = now_ns() - start;
      const uint8_t* src = smem + stage * kTileBytes;
      for (int i = t; i < kTileColumns * 64; i += 256) {  // (row, 16-byte unit)
        const int r = i / 64, u = i % 64;
        const uint4 v =
            *reinterpret_cast<const uint4*>(src + u / 8 * kKvChunkBytes + swizzle(r, u % 8));
        const uint32_t word = uint32_t(rows[n * kTileColumns + r]) * (kRowBytes / 4) + u * 4;
        wrong += (v.x != word) + (v.y != word + 1) + (v.z != word + 2) + (v.w != word + 3);
      }
      if (n >= kHold) ptx::mbar_arrive(&empty[(n - kHold) % kProbeStages]);
    }
    if (wrong) atomicAdd(a.wrong, wrong);
  }
}

__global__ void fill_words(uint32_t* p, size_t words) {  // word i holds i
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i);
}

CUtensorMap row_map(const char* pool, size_t rows) {
  const uint64_t dims[2] = {kRowBytes / 2, rows}, strides[1] = {kRowBytes};
  const uint32_t box[2] = {64, 1};
  CUtensorMap map;
  if (!tensor_map(&map, pool, false, 2, dims, strides, box, "pool"))
    throw smla::Error(smla::ErrorKind::runtime, "pool", "a tensor TMA can map",
                      std::to_string(rows) + " rows of " + std::to_string(kRowBytes) + " bytes");
  return map;
}

double median_us(std::vector<unsigned long long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1e-3;
}

}  // namespace

int run_probe() {
  const size_t big_rows = size_t(4) << 20;  // a 4 GiB pool (HBM); the first 1024 rows: L2
  char* pool;
  int* rows;
  unsigned long long *stamps, *wrong;
  constexpr int kMaxCtas = 132,
                kSmem = kProbeMaxStages * kTileBytes + 2 * kProbeMaxStages * 8 + 1024;
  SMLA_CUDA_CHECK(cudaMalloc(&pool, big_rows * kRowBytes));
  SMLA_CUDA_CHECK(cudaMalloc(&rows, kMaxCtas * kMaxTiles * kTileColumns * sizeof(int)));
  SMLA_CUDA_CHECK(cudaMalloc(&stamps, kMaxCtas * 2 * kMaxTiles * sizeof(unsigned long long)));
  SMLA_CUDA_CHECK(cudaMalloc(&wrong, sizeof(unsigned long long)));
  fill_words<<<1024, 256>>>(reinterpret_cast<uint32_t*>(pool), big_rows * kRowBytes / 4);
  SMLA_CUDA_CHECK(cudaGetLastError());
  const struct {
    void (*kernel)(CUtensorMap, ProbeArgs);
    const char* name;
  } kernels[] = {{probe<kCpAsync, 4>, "cp.async"},
                 {probe<kCpAsyncPlain, 4>, "cp.async nohint"},
                 {probe<kCpAsync, 2>, "cp.async 2 st"},
                 {probe<kCpAsync, 3>, "cp.async 3 st"},
                 {probe<kCpAsync, 6>, "cp.async 6 st"},
                 {probe<kCpAsync, 4, 1>, "4 st, hold 1"},
                 {probe<kCpAsync, 5, 1>, "5 st, hold 1"},
                 {probe<kCpAsync, 6, 2>, "6 st, hold 2"},
                 {probe<kCpAsync, 5, 2>, "5 st, hold 2"},
                 {probe<kCpAsync, 4, 2>, "4 st, hold 2"},
                 {probe<kCpAsyncRowwise, 4>, "cp.async rows"},
                 {probe<kLoadStore, 4>, "ldg + sts"},
                 {probe<kTmaOneWarp, 4>, "tma 1 warp"},
                 {probe<kTmaFourWarps, 4>, "tma 4 warps"}};
  for (const auto& k : kernels)
    SMLA_CUDA_CHECK(
        cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  std::mt19937_64 rng(std::random_device{}());
  printf("%-15s %-5s %4s %5s | %8s %8s | %s\n", "copy", "pool", "ctas", "tiles", "issued0",
         "issuedN", "arrived us: tiles 0 1 2 3 .. last | rate");
  unsigned long long total_wrong = 0;
  for (const size_t span : {size_t(1024), big_rows}) {
    const CUtensorMap map = row_map(pool, span);
    for (const int ctas : {56, kMaxCtas})
      for (const int tiles : {4, 24})
        for (int copy = 0; copy < int(std::size(kernels)); ++copy) {
          std::vector<unsigned long long> issued0, issued_last, arrived[kMaxTiles];
          for (int rep = 0; rep < 9; ++rep) {  // rep 0 warms up
            std::vector<int> h(ctas * tiles * kTileColumns);
            for (int& x : h) x = int(rng() % span);
            SMLA_CUDA_CHECK(
                cudaMemcpy(rows, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
            SMLA_CUDA_CHECK(cudaMemset(wrong, 0, sizeof(unsigned long long)));
            kernels[copy].kernel<<<ctas, kThreads, kSmem>>>(map,
                                                            {pool, rows, tiles, stamps, wrong});
            SMLA_CUDA_CHECK(cudaGetLastError());
            std::vector<unsigned long long> s(ctas * 2 * kMaxTiles);
            unsigned long long w;
            SMLA_CUDA_CHECK(
                cudaMemcpy(s.data(), stamps, s.size() * sizeof(s[0]), cudaMemcpyDeviceToHost));
            SMLA_CUDA_CHECK(cudaMemcpy(&w, wrong, sizeof(w), cudaMemcpyDeviceToHost));
            total_wrong += w;
            if (rep == 0) continue;
            for (int c = 0; c < ctas; ++c) {
              const unsigned long long* cta = &s[c * 2 * kMaxTiles];
              issued0.push_back(cta[0]);
              issued_last.push_back(cta[tiles - 1]);
              for (int n = 0; n < tiles; ++n) arrived[n].push_back(cta[kMaxTiles + n]);
            }
          }
          printf("%-15s %-5s %4d %5d | %8.2f %8.2f |", kernels[copy].name,
                 span == 1024 ? "L2" : "HBM", ctas, tiles, median_us(issued0),
                 median_us(issued_last));
          for (int n = 0; n < std::min(tiles, 4); ++n) printf(" %.2f", median_us(arrived[n]));
          printf(" .. %.2f | %.3f us a tile\n", median_us(arrived[tiles - 1]),
                 (median_us(arrived[tiles - 1]) - median_us(arrived[0])) / (tiles - 1));
        }
  }
  SMLA_CUDA_CHECK(cudaFree(pool));
  SMLA_CUDA_CHECK(cudaFree(rows));
  SMLA_CUDA_CHECK(cudaFree(stamps));
  SMLA_CUDA_CHECK(cudaFree(wrong));
  printf("words that did not match the pool: %llu\n", total_wrong);
  return total_wrong == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  return smla::bench::probe_main(
      argc, argv,
      "How fast one CTA's producer fills the decode kernel's stages, per copy method: when\n"
      "tiles were issued and arrived (medians over CTAs); every byte checked.",
      run_probe);
}
