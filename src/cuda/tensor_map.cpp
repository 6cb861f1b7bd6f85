#include "cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/check.h"
#include "smla/error.h"

namespace smla::cuda {

bool tensor_map(CUtensorMap* map, const void* base, bool bytes, int rank, const uint64_t* dims,
                const uint64_t* byte_strides, const uint32_t* box) {
  // The driver's encoder, found once (the runtime does not link libcuda's symbols).
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SMLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      throw Error(ErrorKind::runtime, "device", "a driver with cuTensorMapEncodeTiled",
                  "none found");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode(map, bytes ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             cuuint32_t(rank), const_cast<void*>(base), dims, byte_strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE) return r == CUDA_SUCCESS;
  // Not a refused layout but a failing driver: the caller's fallback would hide it.
  throw Error(ErrorKind::runtime, "query", "cuTensorMapEncodeTiled to encode or refuse the map",
              "CUresult " + std::to_string(int(r)));
}

}  // namespace smla::cuda
