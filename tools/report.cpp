#include "report.h"

#include <cstdio>
#include <cstdlib>

#include "graph_table.h"
#include "synth.h"

namespace smla::cli {
namespace {

struct Totals {
  std::string kind;
  int layers = 0;
  double seconds = 0, bytes = 0, flops = 0;
};

void print_row(const Totals& t) {
  std::printf("%-10s %6d %10.3f %10.3f %9.2f %9.3f\n", t.kind.c_str(), t.layers, t.seconds * 1e3,
              t.seconds * 1e3 / t.layers, t.bytes / t.seconds / 1e9, t.flops / t.seconds / 1e12);
}

// `x` in the fewest digits that read back as itself: 1e-02, 1.5e-02.
std::string shortest(double x) {
  char text[32];
  for (int digits = 0; digits < 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*e", digits, x);
    if (std::strtod(text, nullptr) == x) break;
  }
  return text;
}

}  // namespace

std::string layer_kind(const LayerSpec& layer) {
  return layer.compress_ratio == 0 ? "swa-only" : "ratio " + std::to_string(layer.compress_ratio);
}

void print_report(const RunReport& r) {
  const RunOptions& o = r.options;
  std::printf(
      "%s: %zu layer%s, %d request%s x %d token%s, seq_len %d, %s KV (%.1f MiB), %s query, "
      "%d SWA group%s, compressed index %s, on %s\n",
      o.model.c_str(), r.layers.size(), r.layers.size() == 1 ? "" : "s", o.requests,
      o.requests > 1 ? "s" : "", o.q_len, o.q_len > 1 ? "s" : "", o.seq_len, kv_layout_name(o.kv),
      r.kv_bytes / 1048576.0, dtype_name(query_dtype(o.kv)), o.swa_groups,
      o.swa_groups > 1 ? "s" : "", compressed_index_name(o.compressed_index), r.device.c_str());
  std::printf("%-10s %6s %10s %10s %9s %9s\n", "layers", "count", "time ms", "ms/layer", "GB/s",
              "TFLOP/s");
  std::vector<Totals> kinds;  // in order of first appearance
  Totals all{.kind = "total"};
  for (const LayerTiming& l : r.layers) {
    auto it =
        std::find_if(kinds.begin(), kinds.end(), [&](const Totals& t) { return t.kind == l.kind; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), Totals{.kind = l.kind});
    // The bytes that must move, as smla_bench's floor counts them: each attended column's KV
    // row and 4-byte index, each token's query and bf16 output; 4 * H * 512 FLOP (QK and PV)
    // per attended column.
    const double tokens = static_cast<double>(o.requests) * o.q_len;
    const double bytes =
        static_cast<double>(l.columns) * (kv_row_bytes(o.kv) + 4) +
        tokens * l.num_heads * kHeadDim * (static_cast<double>(dtype_size(query_dtype(o.kv))) + 2);
    const double flops = 4.0 * l.num_heads * kHeadDim * static_cast<double>(l.columns);
    for (Totals* t : {&*it, &all}) {
      ++t->layers;
      t->seconds += l.seconds;
      t->bytes += bytes;
      t->flops += flops;
    }
  }
  for (const Totals& t : kinds) print_row(t);
  print_row(all);
  int builds = 0;
  for (const auto& [key, count] : r.tables.builds) builds += count;
  std::printf("tables: %d built (%zu forked), %zu lookup%s waited for a fork, peak %.2f MiB\n",
              builds, r.tables.forks.size(), r.tables.waits.size(),
              r.tables.waits.size() == 1 ? "" : "s", r.tables.peak_bytes / 1048576.0);
  if (r.graphs) {
    std::printf(
        "graph: the step captured as one CUDA graph after an eager step, median of %d replays; "
        "builds: its table builds captured alone\n%s\n",
        r.graph_replays, graph_table_header().c_str());
    for (const std::string& row : graph_table_rows(*r.graphs)) std::printf("%s\n", row.c_str());
    for (const std::string& line : graph_problem_lines(*r.graphs))
      std::printf("%s\n", line.c_str());
  }
  if (!r.check) return;
  const CheckResult& c = *r.check;
  std::printf(
      "check: %lld (token, head) rows%s vs a float64 oracle: max |error| %.2e, "
      "max relative %.2e (tolerance %s): %s\n",
      static_cast<long long>(c.rows), c.every_row ? " (every row of each layer)" : "", c.max_error,
      c.max_relative_error, shortest(r.tolerance).c_str(), check_passed(r) ? "ok" : "FAILED");
}

bool check_passed(const RunReport& r) {
  return !r.check || r.check->max_relative_error <= r.tolerance;  // NaN: not passed
}

int exit_status(const RunReport& r) {
  const bool graph_wrong = r.graphs && !graph_problem_lines(*r.graphs).empty();
  return !check_passed(r) || graph_wrong ? 1 : 0;
}

}  // namespace smla::cli
