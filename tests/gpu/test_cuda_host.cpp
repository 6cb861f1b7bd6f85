// The CUDA backend's host helpers: what a failed call's error says (no GPU needed) and leaves
// behind (a GPU needed: without a driver every call returns the failed initialisation), and the
// per-device caches' bounds.
#include <gtest/gtest.h>

#include "cuda/check.h"
#include "cuda/device.h"
#include "device_case.h"
#include "error_check.h"
#include "smla/decode.h"

namespace smla::test {
namespace {

// A sticky error comes back from whatever call runs after the work that caused it: the error
// says so rather than blaming that call alone.
TEST(CudaCheck, StickyErrorsSayAnEarlierFailureMayBeTheCause) {
  for (const cudaError_t status : {cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                                   cudaErrorMisalignedAddress, cudaErrorAssert})
    expect_smla_error([&] { cuda::check(status, "cudaStreamSynchronize(stream)"); },
                      ErrorKind::runtime, "cudaStreamSynchronize(stream)", "cudaSuccess",
                      std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) +
                          "); a sticky error: earlier asynchronous work");
  try {
    cuda::check(cudaErrorInvalidValue, "cudaMemsetAsync(dst, 0, bytes, stream)");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.got(), std::string("cudaErrorInvalidValue (") +
                           cudaGetErrorString(cudaErrorInvalidValue) + ")");
  }
  EXPECT_NO_THROW(cuda::check(cudaSuccess, "cudaGetDevice(&device)"));
}

// A failure names the call that failed, as written: SMLA_CUDA_CHECK takes the call itself, and a
// status stored before (which would name its variable, `e`) is a compile error there.
TEST(CudaCheck, AFailureNamesItsCall) {
  static_assert(cuda::names_a_call("cudaStreamIsCapturing(stream, &status)"));
  static_assert(!cuda::names_a_call("e") && !cuda::names_a_call("status"));
  // No device -1, and without a driver no device at all: an error either way.
  expect_smla_error([] { SMLA_CUDA_CHECK(cudaSetDevice(-1)); }, ErrorKind::runtime,
                    "cudaSetDevice(-1)", "cudaSuccess", "cudaError");
}

// A failed call's error is the exception's alone: the thread's last-error state is cleared, so
// that a framework's next launch check (PyTorch's) does not blame its own kernel for it.
TEST(CudaCheck, AFailedCallLeavesNoLastError) {
  SKIP_WITHOUT_GPU();
  const cudaError_t status = cudaSetDevice(1 << 20);  // no such device
  ASSERT_NE(status, cudaSuccess);
  EXPECT_THROW(cuda::check(status, "cudaSetDevice(1 << 20)"), Error);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaDevice, PerDeviceCachesRefuseIndicesPastTheirSize) {
  cuda::PerDevice<int> cache;
  cache.at(0) = 1;
  cache.at(63) = 2;
  EXPECT_EQ(cache.at(0) + cache.at(63), 3);
  expect_smla_error([&] { cache.at(-1); }, ErrorKind::value, "device", "a CUDA device index >= 0",
                    "-1");
  expect_smla_error([&] { cache.at(64); }, ErrorKind::unsupported, "device",
                    "a CUDA device index below 64", "64");
}

// A negative device index is a wrong value wherever it comes in, with or without a GPU (the
// support check answered "does not exist", unsupported, before asking its sign).
TEST(CudaDevice, NegativeIndicesAreValueErrors) {
  expect_smla_error([] { cuda::require_supported(-1, "query"); }, ErrorKind::value, "query",
                    "a CUDA device index >= 0", "-1");
  expect_smla_error(
      [] {
        workspace_bytes(2, 64, 640, Device{DeviceKind::cuda, -2});
      },
      ErrorKind::value, "device", "a CUDA device index >= 0", "-2");
}

}  // namespace
}  // namespace smla::test
