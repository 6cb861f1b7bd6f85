#if SMLA_WITH_CUDA
#include "graph_timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
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
    (void)cudaGetLastError();  // the error thrown is the one to report, not the capture's end
    throw;
  }
  SMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return Graph(graph);
}

double median_replay_ms(std::span<const cudaGraph_t> graphs, cudaStream_t stream, int replays,
                        double sustained_ms) {
  if (graphs.empty()) throw std::invalid_argument("median_replay_ms: no graph to replay");
  std::vector<std::unique_ptr<CUgraphExec_st, ExecDestroy>> execs;
  for (cudaGraph_t graph : graphs) {
    cudaGraphExec_t exec = nullptr;
    SMLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    execs.emplace_back(exec);
    SMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // uploads it; the first replay untimed
  }
  size_t next = 0;  // the graphs replay in turn
  const auto replay = [&] {
    SMLA_CUDA_CHECK(cudaGraphLaunch(execs[next].get(), stream));
    next = (next + 1) % execs.size();
  };
  // Replays queued back to back with an event between each two, behind enough untimed ones
  // that the GPU is still busy with those when the host has submitted the last timed one: an
  // interval is then one replay's kernels, not the host's launch of it (an event recorded on an
  // idle stream would time that too). A graph whose kernels take less than its submission
  // cannot be kept ahead of: its intervals hold the submission.
  std::vector<Event> marks;
  for (int i = 0; i < 2; ++i) marks.push_back(new_event());
  const auto host_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) replay();
  const double host_ms =  // a replay's submission
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
          .count() / 2;
  SMLA_CUDA_CHECK(cudaEventRecord(marks[0].get(), stream));
  replay();
  SMLA_CUDA_CHECK(cudaEventRecord(marks[1].get(), stream));
  SMLA_CUDA_CHECK(cudaEventSynchronize(marks[1].get()));
  float alone_ms = 0;  // one replay on an idle stream: at least its kernels
  SMLA_CUDA_CHECK(cudaEventElapsedTime(&alone_ms, marks[0].get(), marks[1].get()));
  // Replays that span `sustained_ms` (capped: a replay of a few microseconds would ask for
  // millions of events).
  const int spanning = int(std::min(1e5, std::ceil(sustained_ms / std::max(alone_ms, 1e-3f))));
  const int n = std::max({replays, 1, spanning});
  for (int i = 2; i <= n; ++i) marks.push_back(new_event());
  // Pads p with p * alone >= (p + n) * host: the pads outlast the submissions, doubled for margin.
  const double lead_ms = alone_ms - host_ms;
  const int pads = std::max(
      spanning, lead_ms > 0 ? int(std::min(2000.0, 3 + 2 * std::ceil(n * host_ms / lead_ms))) : 3);
  for (int i = 0; i < pads; ++i) replay();
  for (int i = 0; i < n; ++i) {
    SMLA_CUDA_CHECK(cudaEventRecord(marks[i].get(), stream));
    replay();
  }
  SMLA_CUDA_CHECK(cudaEventRecord(marks[n].get(), stream));
  SMLA_CUDA_CHECK(cudaEventSynchronize(marks[n].get()));
  std::vector<float> ms(n);
  for (int i = 0; i < n; ++i)
    SMLA_CUDA_CHECK(cudaEventElapsedTime(&ms[i], marks[i].get(), marks[i + 1].get()));
  std::nth_element(ms.begin(), ms.begin() + n / 2, ms.end());
  return ms[n / 2];
}

}  // namespace smla::cli
#endif
