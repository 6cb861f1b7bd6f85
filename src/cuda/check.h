// CUDA status checks that turn failures into smla::Error with the call that failed.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "smla/error.h"

namespace smla::cuda {

// Errors that asynchronous work leaves on the context for every later call to return: the call
// that sees one need not be the one that caused it.
inline bool is_sticky(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress: case cudaErrorLaunchTimeout: case cudaErrorAssert:
    case cudaErrorHardwareStackError: case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure: case cudaErrorTensorMemoryLeak: case cudaErrorContained:
    case cudaErrorMpsClientTerminated: case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

// "cudaErrorX (its description)".
inline std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

// Throws for a failed `call`, first taking its error off the thread's last-error state (where a
// framework's next launch check, e.g. PyTorch's, would find it and blame its own kernel).
inline void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  std::string got = describe(status);
  if (is_sticky(status))
    got += "; a sticky error: earlier asynchronous work on this device may have caused it, and "
           "the process must restart to use CUDA again";
  throw Error(ErrorKind::runtime, call, "cudaSuccess", got);
}

}  // namespace smla::cuda

#define SMLA_CUDA_CHECK(call) ::smla::cuda::check((call), #call)
