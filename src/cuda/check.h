// CUDA status checks that turn failures into smla::Error with the call that failed.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "smla/error.h"

namespace smla::cuda {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::runtime, call, "cudaSuccess",
                std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace smla::cuda

#define SMLA_CUDA_CHECK(call) ::smla::cuda::check((call), #call)
