// Step benchmark: one whole decode step's attention for V4-Flash (43 layers) and V4.1-Flash (40),
// 64 and 128 requests x 1 and 2 tokens, contexts 16K and 64K, bf16 caches. Each step runs
// through the executor captured as one CUDA graph (after an eager step) four ways — the
// executor's automatic choice (the default), compressed columns read from the top-k by the
// decode, SPEC §5's shared tables, and every layer building its own: median replay time, the
// graph's nodes by kind, and its table builds captured alone against the whole step; with
// --sustained MS the automatic step again after MS ms of its replays, over MS ms more, and the
// board's power meanwhile (a card at its power limit does not hold a burst's clock). Prints a
// table; --csv writes it too.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "csv_file.h"
#include "graph_table.h"
#include "run_stream.h"
#include "smla/error.h"
#include "smla/model.h"
#include "stdout_status.h"
#include "step_graph.h"
#include "synth.h"

using namespace smla;
using namespace smla::cli;

namespace {

constexpr int kReplays = 30;

struct Options {
  std::string csv_path;
  bool quick = false;  // one model, one shape: a smoke run
  int swa_groups = 3;  // with one, nothing forks
  int sustained_ms = 0;
};

// One step to measure: bf16 caches on the GPU, nothing kept on the host for a check.
RunOptions step_of(const Options& o, const char* model, int seq_len, int requests, int q_len) {
  return {.model = model,
          .requests = requests,
          .seq_len = seq_len,
          .q_len = q_len,
          .kv = KvLayout::bf16,
          .device = DeviceChoice::cuda,
          .check = 0,
          .swa_groups = o.swa_groups};
}

// Every step the bench measures, smallest caches first within a model.
std::vector<RunOptions> steps(const Options& o) {
  if (o.quick) return {step_of(o, "v41-flash", 16384, 64, 2)};
  std::vector<RunOptions> all;
  for (const char* model : {"v4-flash", "v41-flash"})
    for (int seq_len : {16384, 65536})
      for (int requests : {64, 128})
        for (int q_len : {1, 2}) all.push_back(step_of(o, model, seq_len, requests, q_len));
  return all;
}

constexpr const char* kUsage =
    "usage: smla_step_bench [--csv PATH] [--quick] [--swa-groups N (default 3)]\n"
    "                       [--sustained MS (default: 0)]\n"
    "  --sustained MS: also time each shape's automatic step after MS ms of its replays, over\n"
    "                  MS ms more (sust us), and read the board's mean power then (sust W)\n";

// Throws UsageError; the SWA groups are at most the layers of the smaller model (layer l is in
// SWA group l % swa_groups).
Options parse(int argc, char** argv) {
  Options o;
  const std::vector<std::string_view> words = words_of(argc, argv);
  constexpr std::string_view valued[] = {"--csv", "--swa-groups", "--sustained"},
                             switches[] = {"--quick"};
  parse_flags(words, valued, switches, [&](std::string_view flag, std::string_view value) {
    if (flag == "--csv") o.csv_path = csv_path(value);
    if (flag == "--quick") o.quick = true;
    if (flag == "--swa-groups")
      o.swa_groups = number(flag, value, 1, model_preset("v41-flash").num_layers);
    if (flag == "--sustained") o.sustained_ms = number(flag, value, 0, 60000);
  });
  return o;
}

// The step of `r` on `device`, measured both ways; its pools live only as long as this call
// (the Streams, whose block cache holds them, are made and dropped here).
StepGraphs measure(const RunOptions& r, const Options& o, Device device, const RunStream& stream,
                   double& kv_gib) {
  const std::unique_ptr<Streams> streams = make_streams(device, stream.get());
  const SynthStep step(r, model_layers(model_preset(r.model), r.swa_groups), *streams);
  kv_gib = step.kv_bytes / double(1 << 30);
  return measure_step_graphs(step.device, *streams, step.num_tokens, step.max_columns, kReplays,
                             o.sustained_ms);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(kUsage, stdout);
      return stdout_status("smla_step_bench", 0);
    }
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "smla_step_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    const Device device{DeviceKind::cuda, 0};
    make_streams(device);  // throws, saying why, when this GPU cannot run the kernels
    const RunStream stream(device);
    std::printf(
        "%s; bf16 caches, %d SWA group%s; each step captured as one CUDA graph after an eager "
        "step, median of %d replays; builds: its table builds captured alone\n",
        device_name(device).c_str(), o.swa_groups, o.swa_groups > 1 ? "s" : "", kReplays);
    const bool sustained = o.sustained_ms > 0;
    if (sustained)
      std::printf(
          "sust: the auto step after %d ms of its replays, over %d ms more; W: the "
          "board's mean power then\n",
          o.sustained_ms, o.sustained_ms);
    std::printf("%-9s %6s %4s %3s %7s %6s  %s\n", "model", "layers", "req", "q", "seq_len",
                "KV GiB", graph_table_header(sustained).c_str());
    CsvFile csv_file(o.csv_path);
    FILE* csv = csv_file.get();
    if (csv)
      std::fprintf(csv, "model,layers,requests,tokens_per_request,seq_len,swa_groups,kv_gib,%s\n",
                   graph_csv_header().c_str());
    int wrong = 0;
    for (const RunOptions& r : steps(o)) {
      double kv_gib = 0;
      const StepGraphs graphs = measure(r, o, device, stream, kv_gib);
      const int layers = graphs.shared.layers;
      for (const std::string& row : graph_table_rows(graphs, sustained))
        std::printf("%-9s %6d %4d %3d %7d %6.1f  %s\n", r.model.c_str(), layers, r.requests,
                    r.q_len, r.seq_len, kv_gib, row.c_str());
      for (const std::string& row : graph_csv_rows(graphs))
        if (csv)
          std::fprintf(csv, "%s,%d,%d,%d,%d,%d,%.2f,%s\n", r.model.c_str(), layers, r.requests,
                       r.q_len, r.seq_len, r.swa_groups, kv_gib, row.c_str());
      for (const std::string& line : graph_problem_lines(graphs)) {
        std::printf("  %s\n", line.c_str());
        ++wrong;
      }
      std::fflush(stdout);
      if (csv) std::fflush(csv);
    }
    csv_file.close();
    if (wrong) {
      std::fprintf(stderr, "smla_step_bench: %d graph problems (see above)\n", wrong);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla_step_bench: %s\n", e.what());
    return 1;
  }
  return stdout_status("smla_step_bench", 0);  // the table, its whole point
}
