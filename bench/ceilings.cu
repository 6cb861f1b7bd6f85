#include "ceilings.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "cuda/check.h"
#include "timing.h"

namespace smla::bench {
namespace {

// A warp gathers kGatherRows rows with every 16-byte load issued before any is used: one row
// a warp kept 576- and 512-byte rows from filling the memory pipe (fewer bytes in flight than
// DRAM latency needs), which set their ceilings, and so the fp8 floors, too low. The ceiling is
// the best of 2, 4 and 8 rows a warp: one setting's median had moved 576-byte rows by 15%
// between sessions with no code change.
constexpr int kMaxRowUnits = 64;  // 1 KiB rows; at least 32 (512 B)

template <int kGatherRows>
__global__ void gather_rows(const uint4* pool, const int32_t* rows, int num_rows, int row_units,
                            uint4* sink) {
  constexpr int kGatherLoads = kGatherRows * kMaxRowUnits / 32;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int first = warp * kGatherRows;
  if (first >= num_rows) return;
  const int64_t my_row = lane < kGatherRows && first + lane < num_rows ? rows[first + lane] : 0;
  uint4 v[kGatherLoads];
  int r = 0, unit = lane;  // load k reads unit `unit` of the warp's row r (rows >= 32 units)
#pragma unroll
  for (int k = 0; k < kGatherLoads; ++k) {
    const int64_t row = __shfl_sync(~0u, my_row, r % kGatherRows);
    v[k] = r < kGatherRows && first + r < num_rows ? __ldcs(pool + row * row_units + unit)
                                                   : make_uint4(0, 0, 0, 0);
    unit += 32;
    if (unit >= row_units) unit -= row_units, ++r;
  }
  uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < kGatherLoads; ++k)
    acc.x ^= v[k].x, acc.y ^= v[k].y, acc.z ^= v[k].z, acc.w ^= v[k].w;
  if ((acc.x & 0xFFFFFFF) == 0x1234567) sink[0] = acc;  // practically never
}

__device__ uint32_t hash(uint32_t i, uint32_t seed) {
  uint32_t x = (i + 1) * 2654435761u ^ seed;
  x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
  return x;
}

__global__ void fill_rows(int32_t* rows, int n, int pool_rows, uint32_t seed) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) rows[i] = int32_t(hash(i, seed) % uint32_t(pool_rows));
}

// Values in [-1, 1): zeros would flatter the tensor cores.
__global__ void fill_bf16(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16(float(int(hash(uint32_t(i), seed) % 2048) - 1024) / 1024.f);
}

// e4m3 codes of magnitude 2^-3..2^3 (never zero: zeros would flatter the tensor cores).
__global__ void fill_e4m3(uint8_t* x, int64_t n, uint32_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = uint8_t(0x20 + hash(uint32_t(i), seed) % 0x30) | (i % 2 ? 0x80 : 0);
}

void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::runtime, call, "CUBLAS_STATUS_SUCCESS", std::to_string(int(status)));
}

// Device memory freed on every way out (a caller may catch a measurement's error and go on).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { SMLA_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// A cuBLAS or cuBLASLt object (its handle type is a pointer) destroyed by `destroy` on every
// way out.
template <class Handle, cublasStatus_t (*destroy)(Handle)>
struct CublasDestroy {
  void operator()(Handle h) const { destroy(h); }
};
template <class Handle, cublasStatus_t (*destroy)(Handle)>
using CublasOwned = std::unique_ptr<std::remove_pointer_t<Handle>, CublasDestroy<Handle, destroy>>;

}  // namespace

double measure_gather_bandwidth(int row_bytes) {
  if (row_bytes % 16 != 0 || row_bytes < 512 || row_bytes > 16 * kMaxRowUnits)
    throw Error(ErrorKind::value, "row_bytes", "a multiple of 16 in [512, 1024]",
                std::to_string(row_bytes));
  const int64_t pool_bytes = int64_t(4) << 30;
  const int pool_rows = int(pool_bytes / row_bytes);
  const int num_rows = 1 << 20;
  const DeviceBuffer pool(pool_bytes), rows(num_rows * sizeof(int32_t)), sink(sizeof(uint4));
  SMLA_CUDA_CHECK(cudaMemset(pool.as<void>(), 1, pool_bytes));
  fill_rows<<<(num_rows + 255) / 256, 256>>>(rows.as<int32_t>(), num_rows, pool_rows, 12345);
  SMLA_CUDA_CHECK(cudaGetLastError());
  const auto ms_of = [&](auto kernel, int rows_a_warp) {
    const int per_block = 8 * rows_a_warp;  // 256 threads
    return median_graph_ms(
        [&](cudaStream_t s) {
          kernel<<<(num_rows + per_block - 1) / per_block, 256, 0, s>>>(
              pool.as<const uint4>(), rows.as<int32_t>(), num_rows, row_bytes / 16,
              sink.as<uint4>());
          SMLA_CUDA_CHECK(cudaGetLastError());
        },
        20);
  };
  const double ms = std::min({ms_of(gather_rows<2>, 2), ms_of(gather_rows<4>, 4),
                              ms_of(gather_rows<8>, 8)});
  return double(num_rows) * row_bytes / (ms * 1e-3);
}

double measure_bf16_matmul_rate(double sustained_ms) {
  const int n = 8192;
  const DeviceBuffer a(size_t(n) * n * 2), b(size_t(n) * n * 2), c(size_t(n) * n * 2);
  fill_bf16<<<(n * n + 255) / 256, 256>>>(a.as<__nv_bfloat16>(), int64_t(n) * n, 7);
  fill_bf16<<<(n * n + 255) / 256, 256>>>(b.as<__nv_bfloat16>(), int64_t(n) * n, 9);
  SMLA_CUDA_CHECK(cudaGetLastError());
  cublasHandle_t raw_handle;
  cublas_check(cublasCreate(&raw_handle), "cublasCreate");
  const CublasOwned<cublasHandle_t, cublasDestroy> handle(raw_handle);
  const float alpha = 1.f, beta = 0.f;
  const double ms = median_graph_ms(
      [&](cudaStream_t s) {
        cublas_check(cublasSetStream(handle.get(), s), "cublasSetStream");
        cublas_check(cublasGemmEx(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                                  a.as<void>(), CUDA_R_16BF, n, b.as<void>(), CUDA_R_16BF, n,
                                  &beta, c.as<void>(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
      },
      10, sustained_ms);
  return 2.0 * n * n * double(n) / (ms * 1e-3);
}

double measure_e4m3_matmul_rate() {
  const int n = 8192;
  const size_t workspace_bytes = size_t(32) << 20;
  const DeviceBuffer a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n * 2),
      workspace(workspace_bytes);
  fill_e4m3<<<(n * n + 255) / 256, 256>>>(a.as<uint8_t>(), int64_t(n) * n, 7);
  fill_e4m3<<<(n * n + 255) / 256, 256>>>(b.as<uint8_t>(), int64_t(n) * n, 9);
  SMLA_CUDA_CHECK(cudaGetLastError());
  // cuBLASLt runs e4m3 GEMMs in its "TN" form only: A transposed, both operands K-major.
  cublasLtHandle_t raw_handle;
  cublas_check(cublasLtCreate(&raw_handle), "cublasLtCreate");
  const CublasOwned<cublasLtHandle_t, cublasLtDestroy> handle(raw_handle);
  cublasLtMatmulDesc_t raw_op;
  cublas_check(cublasLtMatmulDescCreate(&raw_op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const CublasOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> op(raw_op);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  cublas_check(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                              sizeof(transpose)),
               "cublasLtMatmulDescSetAttribute");
  // The kernel's e4m3 wgmma accumulate without promotion to a wider sum, as fast accumulation
  // does; cuBLASLt's default promotes every few k steps, which can cost it speed.
  const int8_t fast_accumulation = 1;
  cublas_check(cublasLtMatmulDescSetAttribute(op.get(), CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                              &fast_accumulation, sizeof(fast_accumulation)),
               "cublasLtMatmulDescSetAttribute");
  cublasLtMatrixLayout_t raw_fp8, raw_out;
  cublas_check(cublasLtMatrixLayoutCreate(&raw_fp8, CUDA_R_8F_E4M3, n, n, n),
               "cublasLtMatrixLayoutCreate");
  const CublasOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> fp8_layout(raw_fp8);
  cublas_check(cublasLtMatrixLayoutCreate(&raw_out, CUDA_R_16BF, n, n, n),
               "cublasLtMatrixLayoutCreate");
  const CublasOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> out_layout(raw_out);
  cublasLtMatmulPreference_t raw_preference;
  cublas_check(cublasLtMatmulPreferenceCreate(&raw_preference), "cublasLtMatmulPreferenceCreate");
  const CublasOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> preference(
      raw_preference);
  cublas_check(cublasLtMatmulPreferenceSetAttribute(preference.get(),
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)),
               "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  cublas_check(cublasLtMatmulAlgoGetHeuristic(handle.get(), op.get(), fp8_layout.get(),
                                              fp8_layout.get(), out_layout.get(), out_layout.get(),
                                              preference.get(), 1, &heuristic, &found),
               "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    throw Error(ErrorKind::unsupported, "cublasLtMatmulAlgoGetHeuristic",
                "an algorithm for an e4m3 GEMM", "none");
  const float alpha = 1.f, beta = 0.f;
  const double ms = median_graph_ms(
      [&](cudaStream_t s) {
        cublas_check(cublasLtMatmul(handle.get(), op.get(), &alpha, a.as<void>(), fp8_layout.get(),
                                    b.as<void>(), fp8_layout.get(), &beta, c.as<void>(),
                                    out_layout.get(), c.as<void>(), out_layout.get(),
                                    &heuristic.algo, workspace.as<void>(), workspace_bytes, s),
                     "cublasLtMatmul");
      },
      10);
  return 2.0 * n * n * double(n) / (ms * 1e-3);
}

}  // namespace smla::bench
