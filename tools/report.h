// What `smla run` prints: time per layer kind and in total, GB/s (the KV rows and their indices,
// the query and the output: the bytes smla_bench's floor counts) and TFLOP/s, the
// tables' bookkeeping, on CUDA the step's graph four ways (auto, topk, shared, none), and the
// check.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "oracle.h"
#include "smla/tables.h"
#include "step_graph.h"

namespace smla::cli {

struct LayerTiming {
  std::string kind{};  // "swa-only", "ratio 4", ...
  int num_heads = 0;
  double seconds = 0;
  int64_t columns = 0;  // attended columns, all tokens
};

std::string layer_kind(const LayerSpec& layer);

struct RunReport {
  RunOptions options{};
  std::string device{};  // "cpu (2 threads), no warm-up step", "cuda:0, after a warm-up step"
  int64_t kv_bytes = 0;
  std::vector<LayerTiming> layers{};
  TableStats tables{};
  std::optional<CheckResult> check{};
  double tolerance = 0;  // on the check's relative error
  std::optional<StepGraphs> graphs{};  // on CUDA: the step as one graph, four ways
  int graph_replays = 0;
};

void print_report(const RunReport& report);

// Whether the check (if run) is within the tolerance; the run's exit status: 1 when the check
// failed or, on CUDA, the step's graph differs from the eager step.
bool check_passed(const RunReport& report);
int exit_status(const RunReport& report);

}  // namespace smla::cli
