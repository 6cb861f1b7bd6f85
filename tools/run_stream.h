// The stream a run's step goes on: on a CUDA device a non-blocking stream of the run's own,
// since a graph capture cannot use the legacy default stream; none (nullptr) on the CPU.
#pragma once
#include "smla/tensor.h"

namespace smla::cli {

class RunStream {
 public:
  explicit RunStream(Device device);
  ~RunStream();
  RunStream(const RunStream&) = delete;
  RunStream& operator=(const RunStream&) = delete;

  void* get() const { return stream_; }  // a cudaStream_t on CUDA

 private:
  void* stream_ = nullptr;
};

}  // namespace smla::cli
