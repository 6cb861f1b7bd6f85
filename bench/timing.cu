#include "timing.h"

#include <algorithm>
#include <vector>

#include "cuda/check.h"

namespace smla::bench {

double median_graph_ms(const std::function<void(cudaStream_t)>& launches, int replays) {
  cudaStream_t stream;
  SMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  SMLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launches(stream);
  SMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  SMLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  SMLA_CUDA_CHECK(cudaEventCreate(&start));
  SMLA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) SMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> ms(replays);
  for (int i = 0; i < replays; ++i) {
    SMLA_CUDA_CHECK(cudaEventRecord(start, stream));
    SMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SMLA_CUDA_CHECK(cudaEventRecord(stop, stream));
    SMLA_CUDA_CHECK(cudaEventSynchronize(stop));
    SMLA_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  std::nth_element(ms.begin(), ms.begin() + replays / 2, ms.end());
  const double median = ms[replays / 2];
  SMLA_CUDA_CHECK(cudaEventDestroy(start));
  SMLA_CUDA_CHECK(cudaEventDestroy(stop));
  SMLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SMLA_CUDA_CHECK(cudaGraphDestroy(graph));
  SMLA_CUDA_CHECK(cudaStreamDestroy(stream));
  return median;
}

}  // namespace smla::bench
