// CUDA status checks that turn failures into smla::Error with the call that failed.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <string_view>

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

// For calls that cannot throw (destructors, deleters): a failure is left alone, but taken off
// the thread's last-error state as check() does, not left for a framework to blame itself for.
inline void ignore_failure(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
}

// Whether `text`, a macro argument as written, is a call: what SMLA_CUDA_CHECK names a failure by.
// A status stored before (`e`) is not one: its error would name the variable, not what failed.
constexpr bool names_a_call(std::string_view text) { return text.find('(') != text.npos; }

// SMLA_CUDA_CHECK's text for `call`; not a constant (a compile error) unless it names a call.
consteval const char* call_text(const char* text) {
  if (!names_a_call(text))
    throw "SMLA_CUDA_CHECK takes the call itself; check a stored status with check(status, call)";
  return text;
}

}  // namespace smla::cuda

#define SMLA_CUDA_CHECK(call) ::smla::cuda::check((call), ::smla::cuda::call_text(#call))
