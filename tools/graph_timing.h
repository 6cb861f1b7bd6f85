// CUDA graphs of captured work: the capture, and the median time of its replays from CUDA
// events between replays queued back to back. Shared by smla_bench, smla_step_bench and
// `smla run`; include only where CUDA is built.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <span>

namespace smla::cli {

struct GraphDestroy {
  void operator()(cudaGraph_t graph) const { cudaGraphDestroy(graph); }
};
using Graph = std::unique_ptr<CUgraph_st, GraphDestroy>;

// What `enqueue` queues on `stream`, and on streams that wait on it meanwhile, as one graph.
// An exception from `enqueue` ends the capture (dropping its graph) and propagates.
Graph capture_graph(cudaStream_t stream, const std::function<void()>& enqueue);

// Median milliseconds per replay (the upper of the middle two of an even count) on `stream` over
// `replays` replays of `graphs` (at least one) in turn, one an interval, after each one's first and
// three others (two time a submission, one a replay's kernels alone) and, queued before the timed
// ones, enough more that the GPU is busy until all are submitted: no interval holds the host's
// launch. With `sustained_ms` > 0, the untimed replays keep the GPU busy that long first and the
// timed ones span at least as long again: a burst after an idle spell runs at clocks that a card
// at its power limit does not hold (docs/benchmarks.md, ninety-ninth session).
double median_replay_ms(std::span<const cudaGraph_t> graphs, cudaStream_t stream, int replays,
                        double sustained_ms = 0);
inline double median_replay_ms(cudaGraph_t graph, cudaStream_t stream, int replays,
                               double sustained_ms = 0) {
  return median_replay_ms({&graph, 1}, stream, replays, sustained_ms);
}

}  // namespace smla::cli
