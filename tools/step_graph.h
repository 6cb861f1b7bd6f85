// A decode step captured as one CUDA graph four ways — the executor as is (CompressedIndex
// automatic), every compressed layer reading its top-k in the decode, SPEC §5's shared tables,
// and every layer building its own table: the graph's nodes by kind, its median replay time,
// and the time of the step's table builds captured alone — what index building costs of the
// step.
// Shared by `smla run` on CUDA and smla_step_bench.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "progress.h"
#include "smla/executor.h"
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
  int branches = 0;  // nodes of more than one dependent: where forked builds leave the chain
};

struct StepGraph {
  TableSharing sharing = TableSharing::shared;
  CompressedIndex compressed_index = CompressedIndex::automatic;
  int layers = 0;
  int distinct_tables = 0;  // (SWA group, key) pairs: the builds the step must make
  GraphNodes nodes{};
  TableStats tables{};   // the captured step's bookkeeping (builds, forks, waits)
  double step_ms = 0;    // median replay of the whole step
  double builds_ms = 0;  // median replay of the step's table builds alone
  // The step's median replay at a sustained clock (after and over `sustained_ms` of replays,
  // median_replay_ms) and the board's mean power meanwhile (0 where unread); 0 when not asked.
  double sustained_ms = 0;
  double sustained_watts = 0;
  std::string not_run{};  // why this way could not run the step (a top-k wider than the
                          // decode reads on the device); empty when measured
};

// (shared, automatic): the executor as is; (shared, topk); (shared, table); (none, table).
struct StepGraphs {
  StepGraph automatic, topk, shared, none;
};

const char* graph_name(const StepGraph& graph);  // "auto", "topk", "shared", "none"

// The distinct (SWA group, sparse_index_key) pairs of the tables `layers` build in a step on
// `device` whose layers reading every entry have top-k `every_entry_width` wide (table_specs).
int distinct_tables(std::span<const LayerSpec> layers, TableSharing sharing,
                    CompressedIndex compressed_index, int64_t every_entry_width, Device device);

// Where `graph` is not the graph SPEC §5 implies: one build per distinct table, one decode per
// layer, no other kernel, no memset or memcpy, no other node but empty and event ones, no fork
// without sharing, and forks that branch off the step's chain (builds on the side stream). One
// phrase per difference; empty when there is none or it was not run.
std::vector<std::string> graph_problems(const StepGraph& graph);

// The builds alone over the whole step: an estimate of what index building costs it, not a
// bound either way (in the step forked builds overlap decodes, but their inputs may be cold,
// where the builds timed alone find them in L2).
double build_share(const StepGraph& graph);

// What `graph` saves of the step's time with every layer building its own table (negative:
// slower).
double saves(const StepGraph& graph, const StepGraphs& graphs);

// On CUDA, once each way: a fresh StepExecutor runs the step of `data` eagerly (the
// kernels load and the streams' block cache gets every block a capture takes), then the step
// is captured on streams.current() as one graph, its nodes counted and `replays` replays timed,
// then the same for its table builds alone (16 copies a graph, so that their kernels, not the
// graph's submission, are timed); with `sustained_ms` > 0 the automatic way's step is timed again
// after and over that long of its replays; a way the executor refuses as `unsupported` (topk,
// a top-k wider than the decode reads) is not run and says why. streams.current() must be a stream
// of the run's own (RunStream): the legacy default stream cannot be captured. Elsewhere:
// smla::Error, unsupported.
StepGraphs measure_step_graphs(const StepData& data, Streams& streams, int64_t max_tokens,
                               int64_t max_columns, int replays, double sustained_ms = 0,
                               std::chrono::milliseconds progress_every = kProgressEvery);

}  // namespace smla::cli
