#include "cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/check.h"
#include "smla/error.h"

namespace smla::cuda {
namespace {

// A driver function by name (the runtime does not link libcuda's symbols).
template <class Fn>
Fn driver_function(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  SMLA_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || !fn)
    throw Error(ErrorKind::runtime, "device", std::string("a driver with ") + symbol, "none found");
  return reinterpret_cast<Fn>(fn);
}

std::string describe(CUresult r) {
  static const auto name = driver_function<PFN_cuGetErrorName_v6000>("cuGetErrorName");
  const char* text = nullptr;
  return name(r, &text) == CUDA_SUCCESS && text ? text : "CUresult " + std::to_string(int(r));
}

}  // namespace

bool tensor_map(CUtensorMap* map, const void* base, bool bytes, int rank, const uint64_t* dims,
                const uint64_t* byte_strides, const uint32_t* box, const char* argument) {
  static const auto encode =
      driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode(map, bytes ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             cuuint32_t(rank), const_cast<void*>(base), dims, byte_strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE) return r == CUDA_SUCCESS;
  // Not a refused layout but a failing driver: the caller's fallback would hide it.
  throw Error(ErrorKind::runtime, argument, "cuTensorMapEncodeTiled to encode or refuse its map",
              describe(r));
}

}  // namespace smla::cuda
