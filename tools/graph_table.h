// The figures of a step's graphs (step_graph.h) as rows of a printed table and of CSV: the same
// columns in `smla run` and smla_step_bench (CSV's sustained ones empty where not measured). Rows
// come in fours, auto, topk, shared, none; each of the first three says what it saves against none.
// A way not run (StepGraph::not_run) prints why instead of figures and has no CSV row.
#pragma once
#include <string>
#include <vector>

#include "step_graph.h"

namespace smla::cli {

// With `sustained`, two columns after the step's time: its sustained time and the board's power
// (StepGraph::sustained_ms, "-" where not measured).
std::string graph_table_header(bool sustained = false);
std::vector<std::string> graph_table_rows(const StepGraphs& graphs, bool sustained = false);

// "graph WRONG (tables <name>): <problem>" for each of graph_problems' phrases; none when every
// graph is what SPEC §5 implies.
std::vector<std::string> graph_problem_lines(const StepGraphs& graphs);

std::string graph_csv_header();
std::vector<std::string> graph_csv_rows(const StepGraphs& graphs);

}  // namespace smla::cli
