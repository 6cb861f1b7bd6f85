// The host side of the step measurements (tools/): the builds a step must make with and without
// sharing, what counts as a wrong graph, the rows `smla run` and smla_step_bench print, and a
// synthetic step that keeps no host copy of its pools; `smla run --compressed-index`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/streams.h"
#include "args.h"
#include "graph_table.h"
#include "report.h"
#include "smla/error.h"
#include "smla/executor.h"
#include "smla/index.h"
#include "step_graph.h"
#include "synth.h"

namespace smla::cli {
namespace {

// The distinct tables a step must build are what the executor builds, with and without sharing.
TEST(StepGraph, DistinctTablesAreTheExecutorsBuilds) {
  for (const char* model : {"v4-flash", "v41-flash"})
    for (int groups : {1, 3}) {
      const RunOptions o{.model = model,
                         .requests = 2,
                         .seq_len = 300,
                         .q_len = 2,
                         .check = 0,
                         .swa_groups = groups};
      const auto specs = model_layers(model_preset(model), groups);
      const auto streams = make_streams(Device{});
      SynthStep step(o, specs, *streams);
      for (TableSharing sharing : {TableSharing::shared, TableSharing::none})
        for (CompressedIndex compressed_index :
             {CompressedIndex::automatic, CompressedIndex::topk, CompressedIndex::table}) {
          StepExecutor executor(step.device.layers, *streams, step.num_tokens, step.max_columns,
                                sharing, compressed_index);
          executor.build_tables(step.device.inputs);
          int builds = 0;
          for (const auto& [key, count] : executor.tables().stats().builds) builds += count;
          EXPECT_EQ(builds,
                    distinct_tables(specs, sharing, compressed_index,
                                    every_entry_topk_width(specs, step.device.inputs), Device{}))
              << model << ", " << groups << " groups, "
              << graph_name({.sharing = sharing, .compressed_index = compressed_index});
        }
    }
  // SPEC §6's patterns: V4.1's runs share, V4's ratio-4 and ratio-128 layers each have a key;
  // with the top-k read by the decode, a step builds one SWA table per group; automatic reads
  // the top-k in runs where a table would serve one layer of a group (every V4 run, no V4.1 run
  // with one group).
  const auto count = [](const std::vector<LayerSpec>& layers, TableSharing sharing,
                        CompressedIndex compressed_index) {
    return distinct_tables(layers, sharing, compressed_index, 0, Device{});  // the CPU: any top-k
  };
  const auto v41 = model_layers(model_preset("v41-flash"), 1);
  const auto v4 = model_layers(model_preset("v4-flash"), 3);
  EXPECT_EQ(count(v41, TableSharing::shared, CompressedIndex::table), 9);
  EXPECT_EQ(count(v41, TableSharing::none, CompressedIndex::table), 40);
  EXPECT_EQ(count(v41, TableSharing::shared, CompressedIndex::topk), 1);
  EXPECT_EQ(count(model_layers(model_preset("v4-flash"), 1), TableSharing::shared,
                  CompressedIndex::table),
            42);
  EXPECT_EQ(count(v4, TableSharing::shared, CompressedIndex::topk), 3);
  EXPECT_EQ(count(v4, TableSharing::shared, CompressedIndex::automatic), 3);
  EXPECT_EQ(count(v41, TableSharing::shared, CompressedIndex::automatic), 9);
  EXPECT_EQ(count(v41, TableSharing::none, CompressedIndex::automatic), 40);
  // A run reads one way: with three groups V4.1's 4-layer runs (2, 1 and 1 layers a group) read
  // the top-k in every group, its 6-layer runs (2 a group) build: 3 SWA tables + 3 x 3 (the
  // rule per layer built 17); with two groups every run shares its tables.
  const auto v41_3 = model_layers(model_preset("v41-flash"), 3);
  EXPECT_EQ(count(v41_3, TableSharing::shared, CompressedIndex::automatic), 12);
  const auto v41_2 = model_layers(model_preset("v41-flash"), 2);
  EXPECT_EQ(count(v41_2, TableSharing::shared, CompressedIndex::automatic),
            count(v41_2, TableSharing::shared, CompressedIndex::table));
}

// `smla run --compressed-index`: auto by default, each of the three names, and a wrong one
// named with what was expected.
TEST(RunArgs, CompressedIndexFlag) {
  const auto parse = [](std::initializer_list<const char*> words) {
    std::vector<const char*> argv{"smla", "run"};
    argv.insert(argv.end(), words);
    return parse_args(static_cast<int>(argv.size()), argv.data()).run.compressed_index;
  };
  EXPECT_EQ(parse({}), CompressedIndex::automatic);
  EXPECT_EQ(parse({"--compressed-index", "auto"}), CompressedIndex::automatic);
  EXPECT_EQ(parse({"--compressed-index", "topk"}), CompressedIndex::topk);
  EXPECT_EQ(parse({"--compressed-index=table"}), CompressedIndex::table);
  try {
    parse({"--compressed-index", "tables"});
    ADD_FAILURE() << "--compressed-index tables was taken";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--compressed-index: expected auto|topk|table, got 'tables'");
  }
  try {
    parse({"--compressed-index", "topk", "--compressed-index=table"});
    ADD_FAILURE() << "a flag given twice was taken";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--compressed-index: given twice");
  }
}

StepGraph right_graph(TableSharing sharing,
                      CompressedIndex compressed_index = CompressedIndex::table) {
  return {.sharing = sharing,
          .compressed_index = compressed_index,
          .layers = 40,
          .distinct_tables = 26,
          .nodes = {.table_builds = 26, .decodes = 40, .events = 1},
          .step_ms = 2.0,
          .builds_ms = 0.1};
}

TEST(StepGraph, ProblemsNameEachDifference) {
  EXPECT_TRUE(graph_problems(right_graph(TableSharing::shared)).empty());
  StepGraph g = right_graph(TableSharing::none);
  g.nodes.table_builds = 27;
  g.nodes.decodes = 39;
  g.nodes.memsets = 1;
  g.nodes.memcpys = 2;
  g.nodes.other_kernels = 3;
  g.nodes.others = 4;
  g.tables.forks = {{1, "layer 3"}};
  g.nodes.branches = 1;  // off the chain, as forks go
  const std::vector<std::string> want{"27 table builds, expected 26 (one per (SWA group, key))",
                                      "39 decodes, expected 40 (one per layer)",
                                      "3 other kernels",
                                      "1 memset nodes",
                                      "2 memcpy nodes",
                                      "4 other nodes",
                                      "1 forks without sharing"};
  EXPECT_EQ(graph_problems(g), want);
  g = right_graph(TableSharing::shared);
  g.tables.forks = {{1, "2:2:2"}};  // forks are what sharing does
  g.nodes.events += 5;              // what joins leave
  g.nodes.branches = 1;
  EXPECT_TRUE(graph_problems(g).empty());
  g.nodes.branches = 0;  // the forked builds ran on the step's stream
  EXPECT_EQ(graph_problems(g), std::vector<std::string>{"1 forks on the step's chain (no branch: "
                                                        "the builds not on the side stream)"});
  // Each count one off either way (builds and decodes too few as well as too many; a single
  // node of a kind there should be none of) is one problem.
  for (int GraphNodes::*count :
       {&GraphNodes::table_builds, &GraphNodes::decodes, &GraphNodes::other_kernels,
        &GraphNodes::memsets, &GraphNodes::memcpys, &GraphNodes::others})
    for (int delta : {-1, 1}) {
      g = right_graph(TableSharing::shared);
      if ((g.nodes.*count += delta) >= 0) EXPECT_EQ(graph_problems(g).size(), 1u) << g.nodes.*count;
    }
}

StepGraphs right_graphs() {
  StepGraphs graphs{right_graph(TableSharing::shared, CompressedIndex::automatic),
                    right_graph(TableSharing::shared, CompressedIndex::topk),
                    right_graph(TableSharing::shared), right_graph(TableSharing::none)};
  graphs.automatic.step_ms = 1.8;
  graphs.automatic.distinct_tables = graphs.automatic.nodes.table_builds = 9;
  graphs.topk.step_ms = 1.5;
  graphs.topk.distinct_tables = graphs.topk.nodes.table_builds = 3;
  graphs.none.step_ms = 2.5;
  graphs.none.distinct_tables = graphs.none.nodes.table_builds = 40;
  return graphs;
}

TEST(StepGraph, SharesAndSavings) {
  StepGraphs graphs = right_graphs();
  EXPECT_DOUBLE_EQ(build_share(graphs.shared), 0.05);
  EXPECT_DOUBLE_EQ(saves(graphs.shared, graphs), 0.2);
  EXPECT_DOUBLE_EQ(saves(graphs.topk, graphs), 0.4);
  EXPECT_DOUBLE_EQ(saves(graphs.automatic, graphs), 0.28);
  graphs.none.step_ms = 0;  // not measured
  EXPECT_EQ(saves(graphs.shared, graphs), 0);
}

std::vector<std::string> fields(const std::string& csv) {
  std::vector<std::string> out(1);
  for (char ch : csv) {
    if (ch == ',')
      out.emplace_back();
    else
      out.back().push_back(ch);
  }
  return out;
}

TEST(GraphTable, RowsLineUpWithTheirHeader) {
  StepGraphs graphs = right_graphs();
  graphs.none.nodes.decodes = 41;  // wrong: marked so
  const std::vector<std::string> rows = graph_table_rows(graphs);
  ASSERT_EQ(rows.size(), 4u);
  const std::string header = graph_table_header();
  EXPECT_EQ(rows[0].find("  ok"), rows[0].size() - 4);
  EXPECT_EQ(rows[3].find("WRONG"), header.find("graph"));
  EXPECT_EQ(rows[0].substr(0, 4), "auto");
  EXPECT_NE(rows[0].find(" 28.0%"), std::string::npos) << rows[0];  // saves
  EXPECT_EQ(rows[1].substr(0, 4), "topk");
  EXPECT_NE(rows[1].find(" 40.0%"), std::string::npos) << rows[1];  // saves
  EXPECT_EQ(rows[2].substr(0, 6), "shared");
  EXPECT_NE(rows[2].find(" 20.0%"), std::string::npos) << rows[2];   // saves
  EXPECT_NE(rows[2].find("   5.0%"), std::string::npos) << rows[2];  // build share
  EXPECT_EQ(rows[3].substr(0, 4), "none");

  EXPECT_EQ(graph_problem_lines(graphs),
            std::vector<std::string>{
                "graph WRONG (tables none): 41 decodes, expected 40 (one per layer)"});
  graphs.none.nodes.decodes = 40;
  EXPECT_TRUE(graph_problem_lines(graphs).empty());

  const std::vector<std::string> csv = graph_csv_rows(graphs);
  ASSERT_EQ(csv.size(), 4u);
  const std::vector<std::string> names = fields(graph_csv_header());
  for (const std::string& row : csv) EXPECT_EQ(fields(row).size(), names.size()) << row;
  EXPECT_EQ(fields(csv[2])[1], "2000.00");  // step_us
  EXPECT_EQ(fields(csv[2])[4], "0.2000");   // saves
  EXPECT_EQ(fields(csv[3])[4], "");
  const size_t graph_ok = std::find(names.begin(), names.end(), "graph_ok") - names.begin();
  EXPECT_EQ(fields(csv[3]).at(graph_ok), "1");

  // A way the device could not run says why and has no figures, no problems and no CSV row.
  graphs.topk.not_run = "compressed_index: expected top-k widths up to 2048, got 2344";
  const std::vector<std::string> skipped = graph_table_rows(graphs);
  ASSERT_EQ(skipped.size(), 4u);
  EXPECT_EQ(skipped[1], "topk    not run: " + graphs.topk.not_run);
  graphs.topk.nodes.decodes = 0;  // nothing was captured
  EXPECT_TRUE(graph_problem_lines(graphs).empty());
  const std::vector<std::string> measured = graph_csv_rows(graphs);
  ASSERT_EQ(measured.size(), 3u);
  for (const std::string& row : measured) EXPECT_NE(fields(row)[0], "topk") << row;
}

// Each figure in its own column of the table and the CSV, where its header names it; a step not
// timed has no build share.
TEST(GraphTable, EachCountInItsColumn) {
  StepGraphs graphs = right_graphs();
  StepGraph& g = graphs.shared;  // step 2 ms, 20% saved against none
  g.builds_ms = 0.3;
  g.nodes = {.table_builds = 27,
             .decodes = 40,
             .other_kernels = 3,
             .memsets = 1,
             .memcpys = 2,
             .events = 5,
             .others = 4};  // of 26 distinct tables
  g.tables.forks = {{0, "a"}};
  g.tables.waits = {5, 6, 7};
  const std::vector<std::string> names = fields(graph_csv_header());
  const auto column = [&](const std::vector<std::string>& row, const std::string& name) {
    return row.at(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const std::vector<std::string> csv = fields(graph_csv_rows(graphs)[2]);
  ASSERT_EQ(csv.size(), names.size());
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"tables", "shared"},
                                                        {"step_us", "2000.00"},
                                                        {"builds_us", "300.00"},
                                                        {"build_share", "0.1500"},
                                                        {"saves", "0.2000"},
                                                        {"table_builds", "27"},
                                                        {"distinct_tables", "26"},
                                                        {"decodes", "40"},
                                                        {"other_kernels", "3"},
                                                        {"memsets", "1"},
                                                        {"memcpys", "2"},
                                                        {"event_nodes", "5"},
                                                        {"other_nodes", "4"},
                                                        {"forks", "1"},
                                                        {"waits", "3"},
                                                        {"graph_ok", "0"}})
    EXPECT_EQ(column(csv, name), value) << name;
  // The table's columns: tables, step us, builds us, build%, saves, builds, distinct, decodes,
  // otherkern, memset, memcpy, events, othernode, forks, graph.
  std::istringstream row(graph_table_rows(graphs)[2]);
  EXPECT_EQ((std::vector<std::string>{std::istream_iterator<std::string>(row), {}}),
            (std::vector<std::string>{"shared", "2000.0", "300.0", "15.0%", "20.0%", "27", "26",
                                      "40", "3", "1", "2", "5", "4", "1", "WRONG"}));
  EXPECT_EQ(column(csv, "sustained_us"), "");  // not asked
  EXPECT_EQ(column(csv, "sustained_watts"), "");
  graphs.none.step_ms = 0;  // not measured
  EXPECT_EQ(build_share(graphs.none), 0);
  EXPECT_EQ(column(fields(graph_csv_rows(graphs)[3]), "build_share"), "0.0000");
}

// The sustained step's columns: after the step's time where asked for, "-" (CSV: empty) where a
// way was not timed so or the board's power was not read.
TEST(GraphTable, SustainedColumnsWhereAsked) {
  StepGraphs graphs = right_graphs();
  graphs.automatic.sustained_ms = 1.95;
  graphs.automatic.sustained_watts = 688.4;
  const std::string header = graph_table_header(true);
  EXPECT_EQ(header.rfind("tables    step us   sust us sust W builds us", 0), 0u) << header;
  const std::vector<std::string> rows = graph_table_rows(graphs, true);
  EXPECT_EQ(rows[0].find("1950.0") + 6, header.find("sust us") + 7) << rows[0];
  EXPECT_EQ(rows[0].find("688") + 3, header.find("sust W") + 6) << rows[0];
  const auto words = [](const std::string& row) {
    std::istringstream in(row);
    return std::vector<std::string>{std::istream_iterator<std::string>(in), {}};
  };
  const auto first_five = [&](const std::string& row) {
    const std::vector<std::string> all = words(row);
    return std::vector<std::string>(all.begin(), all.begin() + 5);
  };
  EXPECT_EQ(first_five(rows[0]),
            (std::vector<std::string>{"auto", "1800.0", "1950.0", "688", "100.0"}));
  EXPECT_EQ(first_five(rows[2]), (std::vector<std::string>{"shared", "2000.0", "-", "-", "100.0"}));
  EXPECT_EQ(rows[0].find("  ok"), rows[0].size() - 4);
  EXPECT_EQ(rows[3].find("ok"), header.find("graph"));
  EXPECT_EQ(graph_table_rows(graphs), graph_table_rows(graphs, false));  // `smla run`'s
  EXPECT_EQ(words(graph_table_rows(graphs)[0]).size() + 2, words(rows[0]).size());

  const std::vector<std::string> names = fields(graph_csv_header());
  const auto column = [&](const std::string& row, const std::string& name) {
    return fields(row).at(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const std::vector<std::string> csv = graph_csv_rows(graphs);
  EXPECT_EQ(column(csv[0], "sustained_us"), "1950.00");
  EXPECT_EQ(column(csv[0], "sustained_watts"), "688");
  EXPECT_EQ(column(csv[1], "sustained_us"), "");
  graphs.automatic.sustained_watts = 0;  // no NVML
  EXPECT_EQ(column(graph_csv_rows(graphs)[0], "sustained_watts"), "");
  EXPECT_EQ(words(graph_table_rows(graphs, true)[0])[3], "-");
}

// On CUDA the report prints the graphs after the tables: the replays, the graph table's header
// and rows, then a line for each problem.
TEST(Report, GraphsAfterTheTables) {
  RunReport r{.device = "cuda:0, after a warm-up step",
              .layers = {{"swa-only", 64, 1e-3, 1000}},
              .graphs = right_graphs(),
              .graph_replays = 7};
  r.graphs->none.nodes.decodes = 41;
  testing::internal::CaptureStdout();
  print_report(r);
  const std::string out = testing::internal::GetCapturedStdout();
  std::string want =
      "\ngraph: the step captured as one CUDA graph after an eager step, median of 7 replays; "
      "builds: its table builds captured alone\n" +
      graph_table_header() + "\n";
  for (const std::string& line : graph_table_rows(*r.graphs)) want += line + "\n";
  want += "graph WRONG (tables none): 41 decodes, expected 40 (one per layer)\n";
  EXPECT_TRUE(out.ends_with(want)) << out;  // no check: the graphs end it
}

// `smla run` exits 1 when its check fails (past the tolerance, or NaN) or a graph is wrong, and
// prints "FAILED" by the same rule: scripts read the exit code alone.
TEST(Report, ExitStatusFromTheCheckAndTheGraphs) {
  RunReport r{.tolerance = 1e-2};
  EXPECT_EQ(exit_status(r), 0);  // nothing checked, no graphs (--check 0 on the CPU)
  for (const auto& [error, status] : {std::pair{5e-3, 0}, {1e-2, 0}, {1.01e-2, 1},
                                      {std::nan(""), 1}, {HUGE_VAL, 1}}) {
    r.check = CheckResult{.rows = 8, .max_error = 1, .max_relative_error = error};
    EXPECT_EQ(exit_status(r), status) << error;
    EXPECT_EQ(check_passed(r), status == 0) << error;
  }
  r.check->max_relative_error = 0;
  r.graphs = right_graphs();
  EXPECT_EQ(exit_status(r), 0);
  r.graphs->topk.nodes.memsets = 1;  // a memset in the captured step
  EXPECT_EQ(exit_status(r), 1);
}

// The CPU's streams, claiming a device: a SynthStep then takes the path it takes on a GPU.
class DeviceLikeStreams final : public cpu::HostStreams {
 public:
  Device device() const override { return {DeviceKind::cuda, 0}; }
};

// An unchecked step on a device keeps no host copy of pools, queries and outs; its pools are
// one random tile of 256 pages repeated, so only their addresses are distinct.
TEST(SynthStep, UncheckedDeviceStepTilesItsPools) {
  const RunOptions o{.model = "v4-flash", .requests = 3, .seq_len = 30000, .q_len = 2, .check = 0};
  const auto specs = model_layers(model_preset(o.model), 1);
  DeviceLikeStreams streams;
  const SynthStep step(o, specs, streams);
  std::set<const void*> pools;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_FALSE(step.host.layers[i].swa_kv_cache.defined());
    EXPECT_FALSE(step.host.queries[i].defined());
    EXPECT_FALSE(step.host.outs[i].defined());
    EXPECT_TRUE(step.device.queries[i].defined());
    const TensorView& swa = step.device.layers[i].swa_kv_cache;
    ASSERT_TRUE(swa.defined());
    EXPECT_EQ(swa.device.kind, DeviceKind::cuda);
    pools.insert(swa.data);
    if (specs[i].compress_ratio > 0) pools.insert(step.device.layers[i].compressed_kv_cache.data);
  }
  EXPECT_EQ(pools.size(), specs.size() + 41);                  // 43 SWA pools, 41 compressed ones
  EXPECT_TRUE(step.host.inputs.topk_indices.at(2).defined());  // small inputs stay on the host

  // Layer 2's compressed pool: 3 requests x 118 pages of 64 entries (30000 / 4), tiled.
  const TensorView& pool = step.device.layers[2].compressed_kv_cache;
  ASSERT_EQ(pool.size(0), 3 * 118);
  const size_t page = static_cast<size_t>(pool.strides[0]) * 2, tile = 256 * page;
  const auto* bytes = static_cast<const std::byte*>(pool.data);
  EXPECT_EQ(std::memcmp(bytes, bytes + tile, pool.size(0) * page - tile), 0);
  EXPECT_NE(std::memcmp(bytes, bytes + page, page), 0);
  EXPECT_NE(std::memcmp(bytes, bytes + tile / 2, tile / 2), 0);  // 256 pages, not fewer
}

// A checked step on a device downloads the sampled rows of a layer's out, each (token, head)
// row's 512 values and no other, into its host copy.
TEST(SynthStep, DownloadRowsCopiesThoseRows) {
  const RunOptions o{.model = "v4-flash", .requests = 2, .seq_len = 100, .q_len = 3, .check = 8};
  const auto specs = model_layers(model_preset(o.model), 1);
  DeviceLikeStreams streams;
  SynthStep step(o, specs, streams);
  const size_t layer = specs.size() - 1;
  const TensorView &host = step.host.outs[layer], &device = step.device.outs[layer];
  ASSERT_NE(host.data, device.data);
  const int64_t tokens = host.size(0), heads = host.size(1);
  const auto at = [](const TensorView& v, int64_t t, int64_t h, int64_t d) {
    return static_cast<uint16_t*>(v.data) + t * v.strides[0] + h * v.strides[1] + d * v.strides[2];
  };
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < kHeadDim; ++d)
        *at(device, t, h, d) = static_cast<uint16_t>(t * heads + h + 1);
  const std::vector<Row> rows{{0, 1}, {2, heads - 1}, {tokens - 1, 0}, {tokens - 1, 5}};
  step.download_rows(layer, rows);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const bool asked = std::find(rows.begin(), rows.end(), Row{t, h}) != rows.end();
      for (int64_t d = 0; d < kHeadDim; ++d)
        ASSERT_EQ(*at(host, t, h, d), asked ? t * heads + h + 1 : 0) << t << ", " << h << ", " << d;
    }
}

// --check 1 is a check: a device step asked for one row a layer keeps the host copies of its
// pools, queries and outs that the oracle reads, as for more rows.
TEST(SynthStep, DeviceStepCheckedOnOneRowKeepsHostCopies) {
  const RunOptions o{.model = "v4-flash", .requests = 1, .seq_len = 100, .check = 1};
  const auto specs = model_layers(model_preset(o.model), 1);
  DeviceLikeStreams streams;
  const SynthStep step(o, specs, streams);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(step.host.layers[i].swa_kv_cache.defined()) << i;
    EXPECT_TRUE(step.host.queries[i].defined()) << i;
    EXPECT_TRUE(step.host.outs[i].defined()) << i;
    EXPECT_NE(step.host.outs[i].data, step.device.outs[i].data) << i;
    if (specs[i].compress_ratio > 0)
      EXPECT_TRUE(step.host.layers[i].compressed_kv_cache.defined()) << i;
  }
}

// Past 512 x 128 tokens a ratio-128 layer's table (context / 128 entries) is wider than the
// indexers' 512 entries: max_columns, which sizes the executor's workspace on CUDA, is the widest
// layer's, not the last one's.
TEST(SynthStep, MaxColumnsIsTheWidestLayers) {
  const RunOptions o{.requests = 1, .seq_len = 128 * 600, .kv = KvLayout::fp8_e4m3, .check = 0};
  DeviceLikeStreams streams;
  const SynthStep step(o, model_layers(model_preset(o.model), 1), streams);
  int64_t widest = 0;
  for (const auto& [layer, topk] : step.host.inputs.topk_indices)
    widest = std::max(widest, topk.size(1));
  EXPECT_EQ(widest, 600);
  EXPECT_EQ(step.max_columns, sparse_index_columns(kWindow, widest, 0));
}

// Without host copies the host still holds the block tables and the top-k: a step whose
// tables alone pass the host limit is refused by its flags before anything is allocated.
TEST(SynthStep, UncheckedDeviceStepCountsItsHostTables) {
  const RunOptions o{.requests = 1 << 30, .seq_len = 1 << 30, .q_len = 1, .check = 0};
  DeviceLikeStreams streams;
  try {
    const SynthStep step(o, model_layers(model_preset(o.model), 1), streams);
    ADD_FAILURE() << "a step of 2^30 requests of 2^30 tokens was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "--requests, --seq-len, --q-len (with --model and --kv)");
    EXPECT_NE(std::string(e.what()).find("of block tables and top-k"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("of queries and outputs (on the device) and"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace smla::cli
