#include "timing.h"

#include <vector>

#include "cuda/check.h"
#include "graph_timing.h"

namespace smla::bench {
namespace {

// `time(stream)` on a fresh non-blocking stream, after the setup's copies and memsets on the
// legacy stream (which such a stream does not wait for) are done.
double on_fresh_stream(const std::function<double(cudaStream_t)>& time) {
  SMLA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t stream;
  SMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  double ms = 0;
  try {
    ms = time(stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  SMLA_CUDA_CHECK(cudaStreamDestroy(stream));
  return ms;
}

}  // namespace

double median_graph_ms(const std::function<void(cudaStream_t)>& launches, int replays,
                       double sustained_ms) {
  return on_fresh_stream([&](cudaStream_t stream) {
    const cli::Graph graph = cli::capture_graph(stream, [&] { launches(stream); });
    return cli::median_replay_ms(graph.get(), stream, replays, sustained_ms);
  });
}

double median_launch_ms(int count, const std::function<void(cudaStream_t, int)>& launch,
                        int replays, bool chained, double sustained_ms) {
  if (chained)
    return median_graph_ms(
               [&](cudaStream_t stream) {
                 for (int s = 0; s < count; ++s) launch(stream, s);
               },
               replays, sustained_ms) /
           count;
  return on_fresh_stream([&](cudaStream_t stream) {
    std::vector<cli::Graph> graphs;
    std::vector<cudaGraph_t> handles;
    for (int s = 0; s < count; ++s) {
      graphs.push_back(cli::capture_graph(stream, [&] { launch(stream, s); }));
      handles.push_back(graphs.back().get());
    }
    return cli::median_replay_ms(handles, stream, replays, sustained_ms);
  });
}

}  // namespace smla::bench
