// CUDA-event timing of captured graphs: median over replays.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace smla::bench {

// Captures `launches` on a fresh stream into a graph, replays it `replays` times after a
// warm-up, and returns the median milliseconds per replay. `sustained_ms`: as
// cli::median_replay_ms, the GPU kept busy that long first and the replays timed as long.
double median_graph_ms(const std::function<void(cudaStream_t)>& launches, int replays,
                       double sustained_ms = 0);

// Median milliseconds per launch of `launch(stream, s)` for s = 0..count-1. Chained: one graph
// of all `count`, each launch's start overlapping the previous one's end (programmatic
// dependent launch, as a step's layers run); alone: a graph each, replayed in turn with an event
// between, so each starts after the one before has ended, as after a kernel launched without it.
double median_launch_ms(int count, const std::function<void(cudaStream_t, int)>& launch,
                        int replays, bool chained, double sustained_ms = 0);

}  // namespace smla::bench
