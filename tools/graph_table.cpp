#include "graph_table.h"

#include <array>

#include "format.h"

namespace smla::cli {
namespace {

// The graphs in print order.
std::array<const StepGraph*, 4> in_order(const StepGraphs& graphs) {
  return {&graphs.automatic, &graphs.topk, &graphs.shared, &graphs.none};
}

// What `g` saves against none, scaled and printed by `pattern`; `on_none` on none's own row.
std::string saved(const StepGraph* g, const StepGraphs& graphs, const char* pattern, double scale,
                  const char* on_none) {
  return g == &graphs.none ? on_none : format(pattern, scale * saves(*g, graphs));
}

}  // namespace

std::string graph_table_header(bool sustained) {
  return format("%-7s %9s", "tables", "step us") +
         (sustained ? format(" %9s %6s", "sust us", "sust W") : "") +
         format(" %9s %6s %6s  %6s %8s %7s %9s %6s %6s %6s %9s %5s  %s", "builds us", "build%",
                "saves", "builds", "distinct", "decodes", "otherkern", "memset", "memcpy", "events",
                "othernode", "forks", "graph");
}

std::vector<std::string> graph_table_rows(const StepGraphs& graphs, bool sustained) {
  std::vector<std::string> rows;
  for (const StepGraph* g : in_order(graphs)) {
    const GraphNodes& n = g->nodes;
    if (!g->not_run.empty()) {
      rows.push_back(format("%-7s ", graph_name(*g)) + "not run: " + g->not_run);
      continue;
    }
    const std::string sustained_columns =
        sustained ? format(" %9s %6s", measured(g->sustained_ms * 1e3, "%.1f", "-").c_str(),
                           measured(g->sustained_watts, "%.0f", "-").c_str())
                  : "";
    rows.push_back(
        format("%-7s %9.1f", graph_name(*g), g->step_ms * 1e3) + sustained_columns +
        format(" %9.1f %5.1f%% %6s  %6d %8d %7d %9d %6d %6d %6d %9d %5zu  %s", g->builds_ms * 1e3,
               100 * build_share(*g), saved(g, graphs, "%5.1f%%", 100, "-").c_str(), n.table_builds,
               g->distinct_tables, n.decodes, n.other_kernels, n.memsets, n.memcpys, n.events,
               n.others, g->tables.forks.size(), graph_problems(*g).empty() ? "ok" : "WRONG"));
  }
  return rows;
}

std::vector<std::string> graph_problem_lines(const StepGraphs& graphs) {
  std::vector<std::string> lines;
  for (const StepGraph* g : in_order(graphs))
    for (const std::string& problem : graph_problems(*g))
      lines.push_back("graph WRONG (tables " + std::string(graph_name(*g)) + "): " + problem);
  return lines;
}

std::string graph_csv_header() {
  return "tables,step_us,builds_us,build_share,saves,table_builds,distinct_tables,"
         "decodes,other_kernels,memsets,memcpys,event_nodes,other_nodes,forks,waits,graph_ok,"
         "sustained_us,sustained_watts";
}

std::vector<std::string> graph_csv_rows(const StepGraphs& graphs) {
  std::vector<std::string> rows;
  for (const StepGraph* g : in_order(graphs)) {
    const GraphNodes& n = g->nodes;
    if (!g->not_run.empty()) continue;
    rows.push_back(format("%s,%.2f,%.2f,%.4f,%s,%d,%d,%d,%d,%d,%d,%d,%d,%zu,%zu,%d,%s,%s",
                          graph_name(*g), g->step_ms * 1e3, g->builds_ms * 1e3, build_share(*g),
                          saved(g, graphs, "%.4f", 1, "").c_str(), n.table_builds,
                          g->distinct_tables, n.decodes, n.other_kernels, n.memsets, n.memcpys,
                          n.events, n.others, g->tables.forks.size(), g->tables.waits.size(),
                          graph_problems(*g).empty() ? 1 : 0,
                          measured(g->sustained_ms * 1e3, "%.2f", "").c_str(),
                          measured(g->sustained_watts, "%.0f", "").c_str()));
  }
  return rows;
}

}  // namespace smla::cli
