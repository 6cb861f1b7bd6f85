// CUDA-event timing of captured graphs: median over replays.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace smla::bench {

// Captures `launches` on a fresh stream into a graph, replays it `replays` times after a
// warm-up, and returns the median milliseconds per replay.
double median_graph_ms(const std::function<void(cudaStream_t)>& launches, int replays);

}  // namespace smla::bench
