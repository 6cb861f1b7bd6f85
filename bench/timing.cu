#include "timing.h"

#include "cuda/check.h"
#include "graph_timing.h"

namespace smla::bench {

double median_graph_ms(const std::function<void(cudaStream_t)>& launches, int replays) {
  // The setup's copies and memsets ran on the legacy stream, which a non-blocking stream does
  // not wait for.
  SMLA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t stream;
  SMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  double ms = 0;
  {
    const cli::Graph graph = cli::capture_graph(stream, [&] { launches(stream); });
    ms = cli::median_replay_ms(graph.get(), stream, replays);
  }
  SMLA_CUDA_CHECK(cudaStreamDestroy(stream));
  return ms;
}

}  // namespace smla::bench
