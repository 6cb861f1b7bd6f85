#include "step_graph.h"

#include <map>
#include <set>

#include "smla/error.h"

#if SMLA_WITH_CUDA
#include <cuda_runtime.h>

#include "board_power.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/index.h"
#include "graph_timing.h"
#include "progress.h"
#endif

namespace smla::cli {
namespace {

std::string count_of(int n, const std::string& what) { return std::to_string(n) + " " + what; }

#if SMLA_WITH_CUDA
GraphNodes count_nodes(cudaGraph_t graph) {
  size_t count = 0;
  SMLA_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  SMLA_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  GraphNodes n;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    SMLA_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel: {
        cudaKernelNodeParams params{};
        SMLA_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &params));
        if (params.func == cuda::index_kernel())
          ++n.table_builds;
        else if (cuda::is_decode_kernel(params.func))
          ++n.decodes;
        else
          ++n.other_kernels;
        break;
      }
      case cudaGraphNodeTypeMemset:
        ++n.memsets;
        break;
      case cudaGraphNodeTypeMemcpy:
        ++n.memcpys;
        break;
      case cudaGraphNodeTypeEmpty:
      case cudaGraphNodeTypeEventRecord:
      case cudaGraphNodeTypeWaitEvent:
        ++n.events;
        break;
      default:
        ++n.others;
    }
  }
  size_t edges = 0;
  SMLA_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> kinds(edges);  // without them, programmatic edges are refused
  SMLA_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), kinds.data(), &edges));
  std::map<cudaGraphNode_t, int> dependents;
  for (size_t e = 0; e < edges; ++e) n.branches += ++dependents[from[e]] == 2;
  return n;
}

// The builds alone take a few microseconds, less than a graph's submission, which a replay of
// them alone would then time; this many copies in one graph keep the GPU ahead of the host.
constexpr int kBuildCopies = 16;

StepGraph measure(const StepData& data, Streams& streams, int64_t max_tokens, int64_t max_columns,
                  TableSharing sharing, CompressedIndex compressed_index, int replays,
                  double sustained_ms) {
  std::vector<LayerSpec> specs;
  for (const AttentionLayer& l : data.layers) specs.push_back(l.spec);
  StepGraph g{.sharing = sharing,
              .compressed_index = compressed_index,
              .layers = static_cast<int>(specs.size())};
  try {
    g.distinct_tables =
        distinct_tables(specs, sharing, compressed_index,
                        every_entry_topk_width(specs, data.inputs), streams.device());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    g.not_run = e.what();
    return g;
  }
  StepExecutor executor(data.layers, streams, max_tokens, max_columns, sharing, compressed_index);
  const auto step = [&] { executor.run_step(data.inputs, data.queries, data.outs); };
  const auto builds = [&] { executor.build_tables(data.inputs); };
  step();  // eager: the builds alone take the same blocks in the same order
  const auto stream = static_cast<cudaStream_t>(streams.current());
  const Graph step_graph = capture_graph(stream, step);
  g.tables = executor.tables().stats();
  g.nodes = count_nodes(step_graph.get());
  const Graph builds_graph = capture_graph(stream, [&] {
    for (int i = 0; i < kBuildCopies; ++i) builds();
  });
  g.step_ms = median_replay_ms(step_graph.get(), stream, replays);
  g.builds_ms = median_replay_ms(builds_graph.get(), stream, replays) / kBuildCopies;
  if (sustained_ms > 0)
    g.sustained_watts = mean_board_watts(streams.device().id, [&] {
      g.sustained_ms = median_replay_ms(step_graph.get(), stream, replays, sustained_ms);
    });
  return g;  // the graphs go before the executor and the blocks they were served
}
#endif

}  // namespace

const char* graph_name(const StepGraph& g) {
  if (g.sharing == TableSharing::none) return "none";
  return g.compressed_index == CompressedIndex::table ? "shared"
                                                      : compressed_index_name(g.compressed_index);
}

int distinct_tables(std::span<const LayerSpec> layers, TableSharing sharing,
                    CompressedIndex compressed_index, int64_t every_entry_width, Device device) {
  std::set<TableKey> distinct;
  for (const LayerSpec& s :
       table_specs(layers, compressed_index, sharing, every_entry_width, device))
    distinct.insert({s.swa_group, sparse_index_key(s, sharing)});
  return static_cast<int>(distinct.size());
}

std::vector<std::string> graph_problems(const StepGraph& g) {
  std::vector<std::string> problems;
  if (!g.not_run.empty()) return problems;
  const GraphNodes& n = g.nodes;
  if (n.table_builds != g.distinct_tables)
    problems.push_back(count_of(n.table_builds, "table builds") + ", expected " +
                       std::to_string(g.distinct_tables) + " (one per (SWA group, key))");
  if (n.decodes != g.layers)
    problems.push_back(count_of(n.decodes, "decodes") + ", expected " + std::to_string(g.layers) +
                       " (one per layer)");
  if (n.other_kernels) problems.push_back(count_of(n.other_kernels, "other kernels"));
  if (n.memsets) problems.push_back(count_of(n.memsets, "memset nodes"));
  if (n.memcpys) problems.push_back(count_of(n.memcpys, "memcpy nodes"));
  if (n.others) problems.push_back(count_of(n.others, "other nodes"));
  if (g.sharing == TableSharing::none && !g.tables.forks.empty())
    problems.push_back(count_of(static_cast<int>(g.tables.forks.size()), "forks without sharing"));
  if (!g.tables.forks.empty() && n.branches == 0)
    problems.push_back(count_of(static_cast<int>(g.tables.forks.size()), "forks") +
                       " on the step's chain (no branch: the builds not on the side stream)");
  return problems;
}

double build_share(const StepGraph& g) { return g.step_ms > 0 ? g.builds_ms / g.step_ms : 0; }

double saves(const StepGraph& g, const StepGraphs& graphs) {
  return graphs.none.step_ms > 0 ? 1 - g.step_ms / graphs.none.step_ms : 0;
}

StepGraphs measure_step_graphs(const StepData& data, Streams& streams, int64_t max_tokens,
                               int64_t max_columns, int replays, double sustained_ms,
                               std::chrono::milliseconds progress_every) {
#if SMLA_WITH_CUDA
  if (streams.device().kind == DeviceKind::cuda) {
    // A large step takes minutes.
    Progress progress("timing the step as graphs", 4, progress_every);
    const auto way = [&](TableSharing sharing, CompressedIndex compressed_index) {
      const bool automatic = compressed_index == CompressedIndex::automatic;
      StepGraph graph = measure(data, streams, max_tokens, max_columns, sharing, compressed_index,
                                replays, automatic ? sustained_ms : 0);
      progress.advance();
      return graph;
    };
    return {way(TableSharing::shared, CompressedIndex::automatic),
            way(TableSharing::shared, CompressedIndex::topk),
            way(TableSharing::shared, CompressedIndex::table),
            way(TableSharing::none, CompressedIndex::table)};
  }
#else
  (void)data, (void)max_tokens, (void)max_columns, (void)replays, (void)sustained_ms,
      (void)progress_every;
#endif
  throw Error(ErrorKind::unsupported, "device", "a CUDA device (graphs are CUDA's)",
              device_name(streams.device()));
}

}  // namespace smla::cli
