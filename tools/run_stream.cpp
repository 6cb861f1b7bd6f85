#include "run_stream.h"

#if SMLA_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#endif

namespace smla::cli {

RunStream::RunStream(Device device) {
#if SMLA_WITH_CUDA
  if (device.kind != DeviceKind::cuda) return;
  int previous = 0;
  SMLA_CUDA_CHECK(cudaGetDevice(&previous));
  SMLA_CUDA_CHECK(cudaSetDevice(device.id));  // streams belong to the current device
  cudaStream_t stream = nullptr;
  const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const cudaError_t restored = cudaSetDevice(previous);
  if (made == cudaSuccess && restored != cudaSuccess) cudaStreamDestroy(stream);  // not ours yet
  cuda::check(made, "cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)");
  cuda::check(restored, "cudaSetDevice(previous)");
  stream_ = stream;
#else
  (void)device;
#endif
}

RunStream::~RunStream() {
#if SMLA_WITH_CUDA
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

}  // namespace smla::cli
