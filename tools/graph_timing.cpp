#if SMLA_WITH_CUDA
#include "graph_timing.h"

#include <algorithm>
#include <vector>

#include "cuda/check.h"

namespace smla::cli {
namespace {

struct EventDestroy {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
using Event = std::unique_ptr<CUevent_st, EventDestroy>;

Event new_event() {
  cudaEvent_t event = nullptr;
  SMLA_CUDA_CHECK(cudaEventCreate(&event));
  return Event(event);
}

struct ExecDestroy {
  void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
};

}  // namespace

Graph capture_graph(cudaStream_t stream, const std::function<void()>& enqueue) {
  // Global: a call anywhere in the process that a capture cannot hold fails loudly.
  SMLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  SMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return Graph(graph);
}

double median_replay_ms(cudaGraph_t graph, cudaStream_t stream, int replays) {
  cudaGraphExec_t exec_handle = nullptr;
  SMLA_CUDA_CHECK(cudaGraphInstantiate(&exec_handle, graph, 0));
  const std::unique_ptr<CUgraphExec_st, ExecDestroy> exec(exec_handle);
  const Event start = new_event(), stop = new_event();
  for (int i = 0; i < 3; ++i) SMLA_CUDA_CHECK(cudaGraphLaunch(exec.get(), stream));
  std::vector<float> ms(std::max(replays, 1));
  for (float& m : ms) {
    SMLA_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    SMLA_CUDA_CHECK(cudaGraphLaunch(exec.get(), stream));
    SMLA_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    SMLA_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    SMLA_CUDA_CHECK(cudaEventElapsedTime(&m, start.get(), stop.get()));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace smla::cli
#endif
