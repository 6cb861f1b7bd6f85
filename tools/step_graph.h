// A decode step captured as one CUDA graph, with its tables shared (the executor as is) and
// without (every layer builds its own): the graph's nodes by kind, its median replay time, and
// the time of the step's table builds captured alone — what index building costs of the step.
// Shared by `smla run` on CUDA and smla_step_bench.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "smla/tables.h"
#include "synth.h"

namespace smla::cli {

// A captured graph's nodes by kind.
struct GraphNodes {
  int table_builds = 0;  // index-builder kernels
  int decodes = 0;       // decode kernels
  int other_kernels = 0;
  int memsets = 0;
  int memcpys = 0;
  int events = 0;  // empty, event-record and event-wait nodes (what joins may leave)
  int others = 0;  // host, child-graph, allocation, conditional, ... nodes
};

struct StepGraph {
  TableSharing sharing = TableSharing::shared;
  int layers = 0;
  int distinct_tables = 0;  // (SWA group, key) pairs: the builds the step must make
  GraphNodes nodes{};
  TableStats tables{};   // the captured step's bookkeeping (builds, forks, waits)
  double step_ms = 0;    // median replay of the whole step
  double builds_ms = 0;  // median replay of the step's table builds alone
};

struct StepGraphs {
  StepGraph shared, none;
};

const char* sharing_name(TableSharing sharing);  // "shared", "none"

// The distinct (SWA group, sparse_index_key) pairs of `layers` under `sharing`.
int distinct_tables(std::span<const LayerSpec> layers, TableSharing sharing);

// Where `graph` is not the graph SPEC §5 implies: one build per distinct table, one decode per
// layer, no other kernel, no memset or memcpy, no other node but empty and event ones, and no
// fork without sharing. One phrase per difference; empty when there is none.
std::vector<std::string> graph_problems(const StepGraph& graph);

// The builds alone over the whole step: what index building would cost if nothing overlapped
// it (in the step, forked builds overlap decodes, so this bounds their cost from above).
double build_share(const StepGraph& graph);

// What sharing saves of the step's time without it (negative: sharing is slower).
double sharing_saves(const StepGraphs& graphs);

// On CUDA, once with each sharing: a fresh StepExecutor runs the step of `data` eagerly (the
// kernels load and the streams' block cache gets every block a capture takes), then the step
// is captured on streams.current() as one graph, its nodes counted and `replays` replays timed,
// then the same for its table builds alone. streams.current() must be a stream of the run's own
// (RunStream): the legacy default stream cannot be captured. Elsewhere: smla::Error, unsupported.
StepGraphs measure_step_graphs(const StepData& data, Streams& streams, int64_t max_tokens,
                               int64_t max_columns, int replays);

}  // namespace smla::cli
