// StepExecutor: a whole step — compressed columns read from the top-k by the decode, or on
// SPEC §5's shared tables, or every layer building its own — equals, bit for bit, each layer
// building its own table and calling sparse_mla_decode directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "case_gen.h"
#include "core/check.h"
#include "cpu/streams.h"
#include "direct_call.h"
#include "error_check.h"
#include "recording_streams.h"
#include "smla/error.h"
#include "smla/executor.h"
#include "step_case.h"

namespace smla {
namespace {

constexpr int kHeads = 2, kOutHeads = 4;  // out padded past the query's heads

// A small step over three SWA groups: three decode requests on 64-row pages.
const test::CaseShape kThreeRequests{.q_lens = {1, 2, 1},
                                     .seq_lens = {150, 260, 40},
                                     .num_decodes = 3,
                                     .num_groups = 3,
                                     .block_size = 64,
                                     .span = 64};

// A random bf16 query and out of kHeads heads per layer of `c`.
void add_layer_buffers(test::StepCase& c, std::vector<TensorView>& queries,
                       std::vector<TensorView>& outs) {
  for (size_t i = 0; i < c.layers.size(); ++i) {
    queries.push_back(c.bf16(c.num_tokens(), kHeads));
    outs.push_back(c.bf16(c.num_tokens(), kHeads));
  }
}

// The widest table any layer of `c` reads.
int64_t max_columns_of(const test::StepCase& c) {
  int64_t most = 0;
  for (const AttentionLayer& l : c.layers)
    most = std::max(most, sparse_index_columns(c.args(l.spec.layer)));
  return most;
}

// V4.1-Flash's first layers over three SWA groups, up to and including layer `last` (kHeads
// heads each), on a fresh random step, and an executor of `compressed` over streams that log
// each ordering call. Tests name `seed` in a SCOPED_TRACE and take references to the members,
// not a structured binding, which lambdas cannot capture in Clang before 16.
struct LoggedStep {
  LoggedStep(size_t last, CompressedIndex compressed)
      : specs(first_layers(last)),
        c(specs, kThreeRequests, seed),
        executor(c.layers, streams, c.num_tokens(), max_columns_of(c), TableSharing::shared,
                 compressed) {}
  static std::vector<LayerSpec> first_layers(size_t last) {
    const auto all = model_layers(model_preset("v41-flash"), 3, false);
    std::vector<LayerSpec> specs(all.begin(), all.begin() + static_cast<ptrdiff_t>(last) + 1);
    for (LayerSpec& s : specs) s.num_heads = kHeads;
    return specs;
  }
  uint64_t seed = test::fresh_seed();
  std::vector<LayerSpec> specs;
  test::StepCase c;
  test::RecordingStreams streams;
  StepExecutor executor;
};

struct Case {
  const char* model;
  int groups;
  int first_layer, num_layers;  // a slice of the model's layers (MTP ones included)
  test::CaseShape shape;
  int window = kWindow;  // every layer's W
  friend std::ostream& operator<<(std::ostream& os, const Case& c) {
    os << c.model << " layers " << c.first_layer << ".." << c.first_layer + c.num_layers - 1 << ", "
       << c.groups << " SWA groups";
    if (c.window != kWindow) os << ", window " << c.window;
    return os;
  }
};

// Each layer's table built for itself, then the op called directly.
void run_directly(test::StepCase& c, const AttentionLayer& layer, const TensorView& query,
                  const TensorView& out) {
  SparseIndexArgs a = c.args(layer.spec.layer);
  a.out = test::table_outputs(
      a, [&](DType dtype, std::initializer_list<int64_t> shape) { return c.zeros(dtype, shape); });
  build_sparse_indices(a);
  sparse_mla_decode(test::direct_decode_args(layer, a, query, out));
}

class ExecutorMatchesDirectCalls : public testing::TestWithParam<Case> {};

TEST_P(ExecutorMatchesDirectCalls, BitForBit) {
  const Case& p = GetParam();
  const auto all = model_layers(model_preset(p.model), p.groups, true);
  std::vector<LayerSpec> specs(all.begin() + p.first_layer,
                               all.begin() + p.first_layer + p.num_layers);
  for (LayerSpec& s : specs) {
    s.num_heads = kHeads;
    s.window = p.window;
  }
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  test::StepCase c(specs, p.shape, seed);
  c.punch_topk_holes();  // the decode's num_decodes then matters
  const int64_t T = c.num_tokens();
  std::vector<float> sinks{0.5f, -1.0f};
  for (size_t i = 0; i < c.layers.size(); i += 2)
    c.layers[i].sinks = make_view(sinks.data(), DType::f32, Device{}, {kHeads});
  // An SWA-only layer's compressed_kv_cache is never read (in DSpark its columns past W read
  // the SWA pool): NaN there must not reach the outputs.
  for (AttentionLayer& l : c.layers)
    if (l.spec.compress_ratio == 0) l.compressed_kv_cache = c.nan_pool(l.swa_kv_cache);

  std::vector<TensorView> queries, outs, direct_outs;
  int64_t max_columns = 0;
  for (const AttentionLayer& l : c.layers) {
    queries.push_back(c.bf16(T, kHeads));
    outs.push_back(c.bf16(T, kOutHeads));  // garbage in the padded heads must be zeroed
    direct_outs.push_back(c.zeros(DType::bf16, {T, kOutHeads, kHeadDim}));
    max_columns = std::max(max_columns, sparse_index_columns(c.args(l.spec.layer)));
  }
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, T, max_columns);
  executor.run_step(c.inputs, queries, outs);
  // The same outputs from SPEC §5's shared tables, and with every layer building its own.
  std::vector<TensorView> tables_outs, alone_outs;
  for (const TensorView& o : outs) {
    tables_outs.push_back(c.bf16(T, o.size(1)));
    alone_outs.push_back(c.bf16(T, o.size(1)));
  }
  StepExecutor tables(c.layers, *streams, T, max_columns, TableSharing::shared,
                      CompressedIndex::table);
  tables.run_step(c.inputs, queries, tables_outs);
  StepExecutor alone(c.layers, *streams, T, max_columns, TableSharing::none,
                     CompressedIndex::table);
  alone.run_step(c.inputs, queries, alone_outs);

  const size_t bytes = T * kOutHeads * kHeadDim * 2;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    run_directly(c, c.layers[i], queries[i], direct_outs[i]);
    const int layer = c.layers[i].spec.layer;
    EXPECT_EQ(std::memcmp(outs[i].data, direct_outs[i].data, bytes), 0) << "layer " << layer;
    EXPECT_EQ(std::memcmp(tables_outs[i].data, direct_outs[i].data, bytes), 0)
        << "layer " << layer << " on shared tables";
    EXPECT_EQ(std::memcmp(alone_outs[i].data, direct_outs[i].data, bytes), 0)
        << "layer " << layer << " without sharing";
  }
  // The layers shared their tables: one build per (group, key) of what the tables see (a layer
  // that reads its top-k in the decode is SWA-only to them).
  std::set<TableKey> distinct;
  for (const LayerSpec& s : table_specs(specs, CompressedIndex::automatic, TableSharing::shared,
                                        every_entry_topk_width(specs, c.inputs), Device{}))
    distinct.insert({s.swa_group, sparse_index_key(s)});
  int builds = 0;
  for (const auto& [key, count] : executor.tables().stats().builds) builds += count;
  EXPECT_EQ(builds, static_cast<int>(distinct.size()));
  distinct.clear();
  for (const LayerSpec& s : specs) distinct.insert({s.swa_group, sparse_index_key(s)});
  EXPECT_EQ(tables.tables().stats().builds.size(), distinct.size());
  EXPECT_EQ(alone.tables().stats().builds.size(), specs.size());
  EXPECT_TRUE(alone.tables().stats().forks.empty());

  // The table builds alone do what the step's lookups did.
  const TableStats step = executor.tables().stats();
  executor.build_tables(c.inputs);
  const TableStats& tables_alone = executor.tables().stats();
  EXPECT_EQ(tables_alone.builds, step.builds);
  EXPECT_EQ(tables_alone.forks, step.forks);
  EXPECT_EQ(tables_alone.waits, step.waits);
  EXPECT_EQ(tables_alone.peak_bytes, step.peak_bytes);
}

// SPEC §5: tables live for one step. A second step of the same requests, 40 positions shorter,
// must rebuild every table (reusing the first step's would attend the wrong rows).
TEST(Executor, SecondStepRebuildsItsTables) {
  const auto all = model_layers(model_preset("v4-flash"), 1, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 4);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::CaseShape shape{
      .q_lens = {1, 1}, .seq_lens = {300, 200}, .num_decodes = 2, .block_size = 64, .span = 64};
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  test::StepCase c(specs, shape, seed);
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs, direct_outs;
  int64_t max_columns = 0;
  for (const AttentionLayer& l : c.layers) {
    queries.push_back(c.bf16(T, kHeads));
    outs.push_back(c.bf16(T, kHeads));
    direct_outs.push_back(c.zeros(DType::bf16, {T, kHeads, kHeadDim}));
    max_columns = std::max(max_columns, sparse_index_columns(c.args(l.spec.layer)));
  }
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, T, max_columns, TableSharing::shared,
                        CompressedIndex::table);
  executor.run_step(c.inputs, queries, outs);
  std::vector<int32_t> shorter{260, 160};
  c.inputs.metadata.seq_lens = make_view(shorter.data(), DType::i32, Device{}, {2});
  executor.run_step(c.inputs, queries, outs);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    run_directly(c, c.layers[i], queries[i], direct_outs[i]);
    EXPECT_EQ(std::memcmp(outs[i].data, direct_outs[i].data, T * kHeads * kHeadDim * 2), 0)
        << "layer " << c.layers[i].spec.layer;
  }
}

// An SWA-only layer's compressed_kv_cache is never read: a placeholder there (over its own
// out, or no valid view at all) is taken by every step, as the executor took it when made.
TEST(Executor, SwaOnlyLayersIgnoreTheirCompressedPool) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 3);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  ASSERT_EQ(specs[0].compress_ratio, 0);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  test::StepCase c(specs, kThreeRequests, seed);
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  std::vector<TensorView> want;
  for (size_t i = 0; i < outs.size(); ++i) want.push_back(c.bf16(T, kHeads));
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, T, max_columns_of(c));
  executor.run_step(c.inputs, queries, want);
  for (const int ndim : {3, 5}) {
    c.layers[0].compressed_kv_cache = outs[0];
    c.layers[0].compressed_kv_cache.ndim = ndim;
    StepExecutor placeholder(c.layers, *streams, T, max_columns_of(c));
    placeholder.run_step(c.inputs, queries, outs);
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_EQ(std::memcmp(outs[i].data, want[i].data, outs[i].numel() * 2), 0) << i;
  }
  // A cast int is no compressed_index mode (it ran as automatic).
  EXPECT_STREQ(compressed_index_name(static_cast<CompressedIndex>(7)), "?");
  test::expect_smla_error(
      [&] {
        StepExecutor(c.layers, *streams, T, max_columns_of(c), TableSharing::shared,
                     static_cast<CompressedIndex>(7));
      },
      ErrorKind::value, "compressed_index", "table, topk or auto", "7");
}

// SPEC §5: a step ends joined, a failed one too (so that a capture of it reports the error,
// not unjoined side-stream work).
TEST(Executor, StepEndsJoinedEvenWhenALayerFails) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 6);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::StepCase c(specs, kThreeRequests, 3);
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  test::RecordingStreams streams;
  StepExecutor executor(c.layers, streams, T, max_columns_of(c));
  executor.run_step(c.inputs, queries, outs);
  EXPECT_GT(streams.count("fork"), 0);
  EXPECT_EQ(streams.count("join"), streams.count("fork"));  // every fork joined
  EXPECT_EQ(streams.log.back(), "join");
  streams.log.clear();
  queries[1].dtype = DType::u8;  // layer 1's decode refuses it, with layer 0's fork pending
  test::expect_smla_error([&] { executor.run_step(c.inputs, queries, outs); }, ErrorKind::type,
                          "query", "bf16", "u8");
  ASSERT_EQ(streams.count("fork"), 1);
  EXPECT_EQ(streams.log.back(), "join");
  // run_layer alone too (an engine's step with indexers between layers), the step still begun.
  executor.begin_step(c.inputs);
  streams.log.clear();
  test::expect_smla_error([&] { executor.run_layer(c.layers[0].spec.layer, queries[1], outs[0]); },
                          ErrorKind::type, "query", "bf16",
                          "u8 (layer " + std::to_string(c.layers[0].spec.layer) + ")");
  ASSERT_EQ(streams.count("fork"), 1);  // the lookup forked before the decode refused the query
  EXPECT_EQ(streams.log.back(), "join");
  executor.run_layer(c.layers[0].spec.layer, queries[0], outs[0]);
  executor.end_step();
}

// The error a step of `specs` on the CPU raises once `spoil` has changed its inputs or
// queries; none if it runs.
std::optional<Error> step_error(
    const std::vector<LayerSpec>& specs, uint64_t seed,
    const std::function<void(test::StepCase&, std::vector<TensorView>&)>& spoil) {
  test::StepCase c(specs, kThreeRequests, seed);
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, c.num_tokens(), max_columns_of(c));
  spoil(c, queries);
  try {
    executor.run_step(c.inputs, queries, outs);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// Every layer's decode has the same argument names: its errors say which layer (by id) failed.
TEST(Executor, DecodeErrorsNameTheLayer) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin() + 20, all.begin() + 26);  // ids 20..25
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const size_t bad = seed % specs.size();  // not the layer's id: that is 20 more
  const std::string layer = "(layer " + std::to_string(specs[bad].layer) + ")";
  SCOPED_TRACE("bad query for " + layer);
  // Half its bytes: still apart from the other buffers.
  const auto e =
      step_error(specs, seed, [&](auto&, auto& queries) { queries[bad].dtype = DType::u8; });
  ASSERT_TRUE(e) << "no error for the u8 query";
  EXPECT_EQ(e->kind(), ErrorKind::type) << e->what();
  EXPECT_EQ(e->argument(), "query") << e->what();
  EXPECT_EQ(e->got(), "u8 " + layer) << e->what();
}

// A table built for another SWA group fails inside the layer that forked it: its errors say
// which layer's table and which group, and name the group's block table as the caller keyed it.
TEST(Executor, TableErrorsNameTheLayerAndGroup) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 6);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (int group = 0; group < 3; ++group) {
    const auto e = step_error(specs, seed, [&](test::StepCase& c, auto&) {
      c.inputs.block_tables[static_cast<size_t>(group)].dtype = DType::u8;
    });
    ASSERT_TRUE(e) << "no error for group " << group << "'s u8 block table";
    const auto first = std::ranges::find(specs, group, &LayerSpec::swa_group);
    ASSERT_NE(first, specs.end());
    EXPECT_EQ(e->argument(), "block_tables[" + std::to_string(group) + "]") << e->what();
    EXPECT_EQ(e->got(), "u8 (the table of layer " + std::to_string(first->layer) + ", SWA group " +
                            std::to_string(group) + ")")
        << e->what();
  }
}

// A step's block table, compressed block table or top-k that a table build or a decode refuses
// is named as the StepInputs field the caller filled, with its group or layer key (not as the
// build's block_table or the decode's topk_columns), whichever reads it in each mode.
TEST(Executor, StepInputErrorsNameTheCallersFields) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 6);  // groups 0, 1, 2
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const auto compressed = std::ranges::find_if(specs, [](auto& s) { return s.compress_ratio; });
  ASSERT_NE(compressed, specs.end());
  const int kv = compressed->kv_source, index = compressed->index_source;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  // The first row of `view` alone: too few rows for the step's requests or tokens.
  const auto first_row = [](TensorView& view) {
    view = make_view(view.data, view.dtype, view.device, {1, view.size(1)},
                     {view.stride(0), view.stride(1)});
  };
  struct Spoiled {
    std::string argument;
    std::function<void(StepInputs&)> spoil;
  };
  const std::vector<Spoiled> cases{
      {"compressed_block_tables[" + std::to_string(kv) + "]",
       [&](StepInputs& in) { first_row(in.compressed_block_tables.at(kv)); }},
      {"topk_indices[" + std::to_string(index) + "]",
       [&](StepInputs& in) { first_row(in.topk_indices.at(index)); }},
      {"block_tables[1]", [&](StepInputs& in) { first_row(in.block_tables.at(1)); }}};
  for (const CompressedIndex mode :
       {CompressedIndex::table, CompressedIndex::topk, CompressedIndex::automatic})
    for (const Spoiled& bad : cases) {
      SCOPED_TRACE(std::string(compressed_index_name(mode)) + ": " + bad.argument);
      test::StepCase c(specs, kThreeRequests, seed);
      std::vector<TensorView> queries, outs;
      add_layer_buffers(c, queries, outs);
      const auto streams = make_streams(Device{});
      StepExecutor executor(c.layers, *streams, c.num_tokens(), max_columns_of(c),
                            TableSharing::shared, mode);
      StepInputs inputs = c.inputs;
      bad.spoil(inputs);
      try {
        executor.run_step(inputs, queries, outs);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::value) << e.what();
        EXPECT_EQ(e.argument(), bad.argument) << e.what();
        EXPECT_NE(e.got().find("(layer "), e.got().find("(the table of layer ")) << e.what();
        EXPECT_EQ(std::string(e.what()).rfind("smla: " + bad.argument + ": expected ", 0), 0u)
            << e.what();
      }
    }
}

// A top-k's values that a table build or a decode refuses: the expected and got texts name the
// top-k and its compressed block table as the StepInputs fields too (an entry [t][j] of
// topk_indices[S]), not as the build's topk_indices and compressed.block_table or the decode's
// topk_columns.*, whichever reads them in each mode.
TEST(Executor, StepInputErrorTextsNameTheCallersFields) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 6);  // groups 0, 1, 2
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const auto compressed = std::ranges::find_if(specs, [](auto& s) { return s.compress_ratio; });
  ASSERT_NE(compressed, specs.end());
  const std::string topk = "topk_indices[" + std::to_string(compressed->index_source) + "]",
                    table =
                        "compressed_block_tables[" + std::to_string(compressed->kv_source) + "]";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (const CompressedIndex mode :
       {CompressedIndex::table, CompressedIndex::topk, CompressedIndex::automatic})
    for (const bool past_the_pages : {true, false}) {
      SCOPED_TRACE(std::string(compressed_index_name(mode)) +
                   (past_the_pages ? ": an entry past the pages" : ": a valid entry after -1"));
      test::StepCase c(specs, kThreeRequests, seed);  // token 0 is a decode token
      std::vector<TensorView> queries, outs;
      add_layer_buffers(c, queries, outs);
      const auto streams = make_streams(Device{});
      StepExecutor executor(c.layers, *streams, c.num_tokens(), max_columns_of(c),
                            TableSharing::shared, mode);
      const TensorView& entries = c.inputs.topk_indices.at(compressed->index_source);
      ASSERT_GE(entries.size(1), 2);
      int32_t* row = entries.ptr<int32_t>();
      const int64_t pages = c.inputs.compressed_block_tables.at(compressed->kv_source).size(1);
      const TensorView& pool = c.layers[compressed - specs.begin()].compressed_kv_cache;
      const int64_t past = pages * pool.size(1);  // pages * E
      if (past_the_pages) {
        row[0] = static_cast<int32_t>(past);
        test::expect_smla_error(
            [&] { executor.run_step(c.inputs, queries, outs); }, ErrorKind::value, topk,
            "local indices below " + table + " pages * E = " + std::to_string(past),
            topk + "[0][0] = " + std::to_string(past) + " (");
      } else {
        row[0] = -1, row[entries.stride(1)] = 0;
        test::expect_smla_error([&] { executor.run_step(c.inputs, queries, outs); },
                                ErrorKind::value, topk, "a decode token's entries -1 padded",
                                topk + "[0][1] = 0 after [0] = -1 (");
      }
    }
}

// SPEC §4: the DSpark window is for SWA-only layers. A compressed layer that reads its top-k in
// the decode (SWA-only to the tables, which then accept the step) is refused by the executor.
TEST(Executor, DSparkStepRefusesTopkReads) {
  const auto all = model_layers(model_preset("v41-flash"), 3, true);
  std::vector<LayerSpec> specs(all.begin() + 38, all.end());  // 38, 39: ratio 1; MTP: SWA-only
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(seed);
  test::CaseShape shape = test::random_dspark_shape(rng, static_cast<int>(seed % 2));
  ASSERT_GT(shape.decode_swa_width, kWindow);
  shape.num_groups = 3;
  test::StepCase c(specs, shape, seed);
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  // Columns for both steps below: the DSpark rows, and the causal window's top-k reads (a
  // compressed layer has no DSpark width to size).
  const int dspark_width = c.inputs.metadata.decode_swa_width;
  c.inputs.metadata.decode_swa_width = kWindow;
  const int64_t max_columns = std::max<int64_t>(dspark_width, max_columns_of(c));
  c.inputs.metadata.decode_swa_width = dspark_width;
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, T, max_columns, TableSharing::shared,
                        CompressedIndex::topk);
  test::expect_smla_error([&] { executor.run_step(c.inputs, queries, outs); }, ErrorKind::value,
                          "compress_ratio", "0 (the DSpark window is for SWA-only layers)",
                          "1 (layer 38)");
  // A width of W is the causal window, no DSpark one: the top-k reads run.
  c.inputs.metadata.decode_swa_width = kWindow;
  EXPECT_NO_THROW(executor.run_step(c.inputs, queries, outs));
}

// The caller runs an index source's indexer between the layer before it and its own run_layer:
// forks that may still read the top-k it overwrites are joined by then (SPEC §5).
TEST(Executor, JoinsBeforeTheNextIndexSourcesIndexer) {
  // Tables for compressed keys too: the top-k read in a decode needs no join.
  LoggedStep logged(2, CompressedIndex::table);
  const std::vector<LayerSpec>& specs = logged.specs;
  test::StepCase& c = logged.c;
  test::RecordingStreams& streams = logged.streams;
  StepExecutor& executor = logged.executor;
  SCOPED_TRACE(test::seed_note(logged.seed));
  ASSERT_EQ(specs[2].index_source, 2);  // layer 2 computes its own top-k
  const int64_t T = c.num_tokens();
  executor.begin_step(c.inputs);
  executor.run_layer(0, c.bf16(T, kHeads), c.bf16(T, kHeads));  // forks groups 1 and 2
  ASSERT_EQ(streams.count("fork"), 1);
  EXPECT_NE(streams.log.back(), "join");  // layer 1 is no index source
  executor.run_layer(1, c.bf16(T, kHeads), c.bf16(T, kHeads));
  EXPECT_EQ(streams.log.back(), "join");  // layer 2's indexer comes next
  executor.end_step();
  // Layer 1 skipped: layer 2's own lookup joins layer 0's fork first.
  executor.begin_step(c.inputs);
  executor.run_layer(0, c.bf16(T, kHeads), c.bf16(T, kHeads));
  const size_t before = streams.log.size();
  ASSERT_EQ(streams.log[before - 1].rfind("record ", 0), 0u);  // a fork's build, not joined
  executor.run_layer(2, c.bf16(T, kHeads), c.bf16(T, kHeads));
  ASSERT_GT(streams.log.size(), before);
  EXPECT_EQ(streams.log[before], "join");
  executor.end_step();
}

// A top-k wider than the decode reads on the device (2048 columns on CUDA) is read from a built
// table: V4-Flash's ratio-128 layers read every entry, 2344 columns at 300K tokens.
TEST(Executor, TopkWiderThanTheDecodeReadsComesFromTables) {
  EXPECT_EQ(max_topk_width(Device{}), INT64_MAX);
  const Device cuda{DeviceKind::cuda, 0};
  const int64_t limit = max_topk_width(cuda);
#if !SMLA_WITH_CUDA
  EXPECT_EQ(limit, 0);
  GTEST_SKIP() << "no CUDA backend in this build";
#endif
  ASSERT_EQ(limit, 2048);
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto reads_every_entry = [](const LayerSpec& s) {
    return s.compress_ratio > 0 && s.index_topk == 0;
  };
  const auto dense = std::ranges::count_if(specs, reads_every_entry);
  ASSERT_GT(dense, 0);
  const auto tables_read = [&](int64_t every_entry_width, Device device) {
    int64_t read = 0;  // compressed layers whose columns come from a table
    for (const LayerSpec& s : table_specs(specs, CompressedIndex::automatic, TableSharing::shared,
                                          every_entry_width, device))
      read += s.compress_ratio > 0;
    return read;
  };
  // Every V4 run reads its top-k in the decode (each key is one layer's) while it fits; past
  // the limit the layers reading every entry build tables, the indexed ones (512) do not.
  EXPECT_EQ(tables_read(limit, cuda), 0);
  EXPECT_EQ(tables_read(limit + 1, cuda), dense);
  EXPECT_EQ(tables_read(2344, cuda), dense);
  EXPECT_EQ(tables_read(2344, Device{}), 0);  // the CPU reads any width
  EXPECT_NO_THROW(table_specs(specs, CompressedIndex::topk, TableSharing::shared, limit, cuda));
  const auto first = std::ranges::find_if(specs, reads_every_entry);
  const std::string layer = "layers[" + std::to_string(first - specs.begin()) + "] (layer " +
                            std::to_string(first->layer) + ") reading up to 2344";
  test::expect_smla_error(
      [&] { table_specs(specs, CompressedIndex::topk, TableSharing::shared, 2344, cuda); },
      ErrorKind::unsupported, "compressed_index",
      "for compressed_index \"topk\"; \"table\" or \"auto\" build tables", layer);
}

// A step's width is that of the top-k its layers reading every entry take (their index
// sources'), whatever the indexed layers' (wider here) are; none given, 0.
TEST(Executor, EveryEntryTopkWidthIsTheirIndexSourcesOnly) {
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  std::set<int> every_entry_sources;
  for (const LayerSpec& s : specs)
    if (s.compress_ratio > 0 && s.index_topk == 0) every_entry_sources.insert(s.index_source);
  ASSERT_FALSE(every_entry_sources.empty());
  StepInputs inputs;
  std::vector<int32_t> none;
  for (const LayerSpec& s : specs)
    if (s.compress_ratio > 0)
      inputs.topk_indices[s.index_source] =
          make_view(none.data(), DType::i32, Device{},
                    {2, every_entry_sources.contains(s.index_source) ? 2344 : 3000});
  EXPECT_EQ(every_entry_topk_width(specs, inputs), 2344);
  EXPECT_EQ(every_entry_topk_width(specs, StepInputs{}), 0);
}

// Each decode checks its own arguments; a step's outs must also stay off every other layer's
// query, out and pools and the step's inputs, which later layers read.
TEST(Executor, StepOutsApartFromAllTheStepReads) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 4);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::StepCase c(specs, kThreeRequests, test::fresh_seed());
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, T, max_columns_of(c));
  executor.run_step(c.inputs, queries, outs);
  const auto refused = [&](std::vector<TensorView> o, const char* written, const char* other) {
    test::expect_smla_error([&] { executor.run_step(c.inputs, queries, o); }, ErrorKind::value,
                            written, std::string("memory apart from ") + other,
                            std::string("an overlap with ") + other);
  };
  std::vector<TensorView> o = outs;
  o[0] = queries[2];
  refused(o, "outs[0]", "queries[2]");
  o = outs;
  o[3] = outs[1];
  refused(o, "outs[1]", "outs[3]");
  o = outs;
  o[1] = c.layers[3].swa_kv_cache;  // a pool's first rows as an out's bytes
  o[1].dtype = DType::bf16, o[1].ndim = 3;
  o[1].shape[0] = T, o[1].shape[1] = kHeads, o[1].shape[2] = kHeadDim;
  o[1].strides[0] = kHeads * kHeadDim, o[1].strides[1] = kHeadDim, o[1].strides[2] = 1;
  refused(o, "outs[1]", "layers[3].swa_kv_cache");
  ASSERT_FALSE(c.inputs.topk_indices.empty());
  const auto& [key, topk] = *c.inputs.topk_indices.begin();
  o = outs;
  o[2].data = topk.data;  // an out over the top-k a later layer's table or decode reads
  refused(o, "outs[2]", ("topk_indices[" + std::to_string(key) + "]").c_str());
  // The metadata's fields by their own names, as every other executor error gives them.
  o = outs;
  o[0].data = c.inputs.metadata.seq_lens.data;
  refused(o, "outs[0]", "seq_lens");
}

// run_layer's out over a top-k its decode reads (topk mode): the decode's overlap error names
// the top-k as the StepInputs field, not as the decode's topk_columns.topk_indices.
TEST(Executor, RunLayerOutApartFromTheTopkNamesTheStepInput) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  const auto compressed =
      std::ranges::find_if(all, [](const LayerSpec& s) { return s.compress_ratio > 0; });
  ASSERT_NE(compressed, all.end());
  LoggedStep logged(static_cast<size_t>(compressed - all.begin()), CompressedIndex::topk);
  SCOPED_TRACE(test::seed_note(logged.seed));
  test::StepCase& c = logged.c;
  const LayerSpec& s = logged.specs.back();
  const int64_t T = c.num_tokens();
  logged.executor.begin_step(c.inputs);
  TensorView out = c.bf16(T, kHeads);
  out.data = c.inputs.topk_indices.at(s.index_source).data;
  const std::string topk = "topk_indices[" + std::to_string(s.index_source) + "]";
  test::expect_smla_error([&] { logged.executor.run_layer(s.layer, c.bf16(T, kHeads), out); },
                          ErrorKind::value, "out", "memory apart from " + topk,
                          "an overlap with " + topk + " (layer " + std::to_string(s.layer));
}

// run_layer's out over what its own decode does not read but the step does: another SWA group's
// block table (its lookup's forks read it as the decode writes out; on CUDA, at once) and
// another layer's pool. Refused by name before any write, it was taken. The step goes on.
TEST(Executor, RunLayerOutApartFromWhatTheStepReads) {
  LoggedStep logged(3, CompressedIndex::automatic);  // layers 0..3, SWA groups 0, 1, 2, 0
  SCOPED_TRACE(test::seed_note(logged.seed));
  test::StepCase& c = logged.c;
  const int64_t T = c.num_tokens();
  ASSERT_EQ(logged.specs[0].compress_ratio, 0);  // layer 0 reads its SWA pool alone
  ASSERT_GT(logged.specs[2].compress_ratio, 0);
  logged.executor.begin_step(c.inputs);
  const TensorView query = c.bf16(T, kHeads);
  const auto refused = [&](const TensorView& over, const std::string& name) {
    TensorView out = c.bf16(T, kHeads);
    out.data = over.data;
    const auto* first = static_cast<const std::byte*>(over.data);  // its first (up to) 64 bytes
    const std::vector<std::byte> before(
        first, first + std::min<int64_t>(64, over.numel() * int64_t(dtype_size(over.dtype))));
    test::expect_smla_error([&] { logged.executor.run_layer(0, query, out); }, ErrorKind::value,
                            "out", "memory apart from " + name,
                            "an overlap with " + name + " (layer 0)");
    EXPECT_EQ(std::memcmp(before.data(), first, before.size()), 0) << name << " written";
  };
  refused(c.inputs.block_tables[1], "block_tables[1]");
  refused(c.layers[2].compressed_kv_cache, "layers[2].compressed_kv_cache");
  EXPECT_NO_THROW(logged.executor.run_layer(0, query, c.bf16(T, kHeads)));
  logged.executor.end_step();
}

// A run_layer refused for its order joins first, as every refused call does, so that a capture
// of the step can still end; the order check had thrown unjoined after a layer that forked.
TEST(Executor, RunLayerOutOfOrderJoinsFirst) {
  LoggedStep logged(3, CompressedIndex::automatic);
  SCOPED_TRACE(test::seed_note(logged.seed));
  test::StepCase& c = logged.c;
  const int64_t T = c.num_tokens();
  logged.executor.begin_step(c.inputs);
  const int64_t joins = logged.streams.count("join");
  logged.executor.run_layer(0, c.bf16(T, kHeads), c.bf16(T, kHeads));
  ASSERT_GT(logged.streams.count("fork"), 0);  // layer 0's lookup forked the other groups'
  ASSERT_EQ(logged.streams.count("join"), joins);
  test::expect_smla_error(
      [&] { logged.executor.run_layer(0, c.bf16(T, kHeads), c.bf16(T, kHeads)); }, ErrorKind::value,
      "layer", "a layer after layer 0", "layer 0");
  EXPECT_EQ(logged.streams.count("join"), joins + 1);
}

TEST(Executor, RunLayerNeedsABegunStep) {
  const auto all = model_layers(model_preset("v41-flash"), 1, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 2);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::StepCase c(
      specs, {.q_lens = {1}, .seq_lens = {150}, .num_decodes = 1, .block_size = 64, .span = 64},
      test::fresh_seed());
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, 1, 1024);
  const TensorView q = c.bf16(1, kHeads), o = c.bf16(1, kHeads);
  test::expect_smla_error([&] { executor.run_layer(0, q, o); }, ErrorKind::value, "run_layer",
                          "a step begun by begin_step(inputs) first", "no step begun");
  executor.begin_step(c.inputs);
  EXPECT_NO_THROW(executor.run_layer(0, q, o));
  executor.end_step();
  // An ended step, and a refused one after a good one, leave no inputs for a layer to read.
  test::expect_smla_error([&] { executor.run_layer(1, q, o); }, ErrorKind::value, "run_layer",
                          "a step begun by begin_step(inputs) first", "no step begun");
  executor.begin_step(c.inputs);
  StepInputs refused = c.inputs;  // a strided cum_seq_lens_q, which the decodes cannot read
  std::vector<int32_t> cum{0, -1, 1, -1};
  refused.metadata.cum_seq_lens_q = make_view(cum.data(), DType::i32, Device{}, {2}, {2});
  EXPECT_THROW(executor.begin_step(refused), Error);
  test::expect_smla_error([&] { executor.run_layer(0, q, o); }, ErrorKind::value, "run_layer",
                          "a step begun by begin_step(inputs) first", "no step begun");
}

// Layers run in model order, each once a step: a layer at or before the last that ran may read a
// top-k a later indexer has overwritten since. Skipping is allowed, and a refused call's layer
// runs again.
TEST(Executor, RunLayerTakesLayersInModelOrder) {
  LoggedStep logged(2, CompressedIndex::automatic);
  test::StepCase& c = logged.c;
  StepExecutor& executor = logged.executor;
  SCOPED_TRACE(test::seed_note(logged.seed));
  const int64_t T = c.num_tokens();
  const TensorView q = c.bf16(T, kHeads), o = c.bf16(T, kHeads);
  executor.begin_step(c.inputs);
  executor.run_layer(1, q, o);  // layer 0 skipped
  test::expect_smla_error([&] { executor.run_layer(0, q, o); }, ErrorKind::value, "layer",
                          "a layer after layer 1 (layers run in model order, each once a step)",
                          "layer 0");
  test::expect_smla_error([&] { executor.run_layer(1, q, o); }, ErrorKind::value, "layer",
                          "a layer after layer 1", "layer 1");
  TensorView bad = q;
  bad.dtype = DType::u8;
  test::expect_smla_error([&] { executor.run_layer(2, bad, o); }, ErrorKind::type, "query", "bf16",
                          "u8 (layer 2)");
  EXPECT_NO_THROW(executor.run_layer(2, q, o));  // refused above: it runs again
  executor.end_step();
  executor.begin_step(c.inputs);  // a new step starts from the first layer
  EXPECT_NO_THROW(executor.run_layer(0, q, o));
  executor.end_step();
}

// run_step compares its outs' bytes with every view the step reads before any layer checks
// them: one whose byte extent overflows int64 is refused by name first. Its extent was computed
// overflowed (undefined behaviour), wrapped to below its data, and refused as an overlap of the
// out that ends there.
TEST(Executor, StepViewsPastInt64AreRefusedBeforeTheOverlapCheck) {
  LoggedStep logged(2, CompressedIndex::automatic);
  test::StepCase& c = logged.c;
  SCOPED_TRACE(test::seed_note(logged.seed));
  const int64_t T = c.num_tokens();
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  const TensorView memory = c.bf16(T + 1, kHeads);  // out 0, then seq_lens' first elements
  outs[0] = make_view(memory.data, DType::bf16, Device{}, {T, kHeads, kHeadDim});
  StepInputs inputs = c.inputs;
  inputs.metadata.seq_lens =
      make_view(memory.ptr<uint16_t>() + T * kHeads * kHeadDim, DType::i32, Device{}, {INT64_MAX});
  test::expect_smla_error([&] { logged.executor.run_step(inputs, queries, outs); },
                          ErrorKind::value, "seq_lens",
                          "sizes and strides whose element count and byte extent fit in int64",
                          "[9223372036854775807]");
  EXPECT_EQ(logged.executor.steps_begun(), 0u);
  EXPECT_NO_THROW(logged.executor.run_step(c.inputs, queries, outs));
}

// Host buffers between guard bytes, for the mutated steps below: a copy's rows are padded with
// guard bytes too, and `changed` says whether a byte outside the outputs' elements moved.
class Guarded {
 public:
  // An i32 copy of a 1-D or 2-D view (a 2-D one's rows padded; its last dim contiguous).
  TensorView copy(const TensorView& v) {
    const int64_t rows = v.size(0), cols = v.ndim == 2 ? v.size(1) : 1;
    const int64_t pitch = v.ndim == 2 ? cols + 3 : 1;
    int32_t* data = reinterpret_cast<int32_t*>(buffer(size_t(rows * pitch) * 4));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k)
        data[r * pitch + k] = v.ptr<const int32_t>()[r * v.stride(0) + k * v.stride(-1)];
    return v.ndim == 2 ? make_view(data, DType::i32, Device{}, {rows, cols}, {pitch, 1})
                       : make_view(data, DType::i32, Device{}, {rows});
  }
  TensorView out(int64_t T, int64_t H) {
    const int64_t row = H * kHeadDim + 8;
    return make_view(buffer(size_t(T * row) * 2), DType::bf16, Device{}, {T, H, kHeadDim},
                     {row, kHeadDim, 1});
  }
  TensorView i32_out(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return make_view(buffer(size_t(n) * 4), DType::i32, Device{}, shape);
  }
  void snapshot() { saved_ = buffers_; }
  bool changed(const std::vector<TensorView>& outputs) const {
    std::list<std::vector<bool>> mask;  // a byte an output may write
    for (const auto& b : buffers_) mask.emplace_back(b.size(), false);
    for (const TensorView& v : outputs) allow(v, mask);
    auto s = saved_.begin();
    auto m = mask.begin();
    for (const auto& b : buffers_) {
      for (size_t i = 0; i < b.size(); ++i)
        if (!(*m)[i] && b[i] != (*s)[i]) return true;
      ++s, ++m;
    }
    return false;
  }

 private:
  static constexpr size_t kGuard = 64;
  std::byte* buffer(size_t bytes) {
    buffers_.emplace_back(bytes + 2 * kGuard, std::byte{0xa5});
    return buffers_.back().data() + kGuard;
  }
  void allow(const TensorView& v, std::list<std::vector<bool>>& mask) const {
    if (!v.defined() || v.numel() == 0) return;
    const auto* first = static_cast<const std::byte*>(v.data);
    auto m = mask.begin();
    for (auto b = buffers_.begin(); b != buffers_.end(); ++b, ++m) {
      if (first < b->data() || first >= b->data() + b->size()) continue;
      const int64_t size = int64_t(dtype_size(v.dtype));
      int64_t at[kMaxDims] = {};  // an odometer over v's elements
      for (int64_t n = 0; n < v.numel(); ++n) {
        int64_t offset = 0;
        for (int d = 0; d < v.ndim; ++d) offset += at[d] * v.strides[d];
        const int64_t byte = first - b->data() + offset * size;
        for (int64_t k = 0; k < size; ++k)
          if (byte + k >= 0 && byte + k < int64_t(b->size())) (*m)[byte + k] = true;
        for (int d = v.ndim - 1; d >= 0 && ++at[d] == v.shape[d]; --d) at[d] = 0;
      }
    }
  }
  std::list<std::vector<std::byte>> buffers_, saved_;
};

// Fresh small steps with one or two inputs spoiled (values past their ranges, missing entries,
// narrowed tables, counts and widths no step has, views past int64 or the address space), each
// through one layer's build_sparse_indices and the executor's run_step: refused with
// smla::Error, or run writing nothing outside the outputs (guard bytes around every buffer and
// between its rows stay as they were).
TEST(Executor, SpoiledStepsAreRefusedOrWriteOnlyTheirOutputs) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::printf("%s\n", test::seed_note(seed).c_str());  // before a crash, which leaves no trace
  std::fflush(stdout);                                 // ctest's pipe: fully buffered
  std::mt19937_64 rng(seed);
  const auto draw = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const auto all = model_layers(model_preset("v41-flash"), 2, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 4);  // SWA-only x2, then ratio 2
  for (LayerSpec& s : specs) {
    s.num_heads = kHeads;
    if (s.index_topk > 0) s.index_topk = 16;
  }
  const int32_t bad[] = {-1, INT32_MIN, INT32_MAX, 1 << 20, 0};
  test::BoundedHostStreams streams(size_t{1} << 26);  // 64 MiB: more than a small step needs
  for (int trial = 0; trial < 150; ++trial) {
    test::CaseShape shape{.num_groups = 2,
                          .block_size = int(draw(1, 32)),
                          .entries_per_page = int(draw(1, 8)),
                          .invalid_fraction = draw(0, 1) ? 0.2 : 0.0};
    shape.span = shape.block_size, shape.compressed_span = shape.entries_per_page;
    const int64_t B = draw(1, 4);
    shape.num_decodes = int(draw(0, B));
    for (int64_t b = 0; b < B; ++b) {
      shape.q_lens.push_back(int(draw(1, b < shape.num_decodes ? 3 : 6)));
      shape.seq_lens.push_back(shape.q_lens.back() + int(draw(0, 200)));
    }
    test::StepCase c(specs, shape, rng());
    const int64_t T = c.num_tokens();
    Guarded g;
    StepInputs in = c.inputs;
    in.metadata.seq_lens = g.copy(in.metadata.seq_lens);
    in.metadata.cum_seq_lens_q = g.copy(in.metadata.cum_seq_lens_q);
    for (TensorView& t : in.block_tables) t = g.copy(t);
    for (auto& entry : in.compressed_block_tables) entry.second = g.copy(entry.second);
    for (auto& entry : in.topk_indices) entry.second = g.copy(entry.second);
    const auto some = [&](auto& map) -> TensorView& {
      auto it = map.begin();
      std::advance(it, draw(0, int64_t(map.size()) - 1));
      return it->second;
    };
    int32_t none = 0;  // the cell of a view narrowed to nothing
    const auto cell = [&](const TensorView& t) -> int32_t& {
      if (t.numel() == 0) return none;
      return t.ptr<int32_t>()[draw(0, t.size(0) - 1) * t.stride(0) +
                              (t.ndim == 2 ? draw(0, t.size(1) - 1) : 0)];
    };
    std::string spoiled;
    bool past = false;
    for (int64_t n = draw(1, 2); n > 0; --n) {
      StepMetadata& m = in.metadata;
      const int64_t kind = draw(0, 11);
      spoiled += std::to_string(kind) + " ";
      switch (kind) {
        case 0:
          m.num_tokens = draw(0, 1) ? T + 1 : int64_t{1} << 28;
          break;
        case 1:
          cell(m.seq_lens) = bad[draw(0, 4)];
          break;
        case 2:
          cell(m.cum_seq_lens_q) = bad[draw(0, 4)];
          break;
        case 3:
          cell(in.block_tables[draw(0, 1)]) = bad[draw(0, 4)];
          break;
        case 4:
          in.block_tables[draw(0, 1)].shape[1] -= 1;
          break;
        case 5:
          cell(some(in.compressed_block_tables)) = bad[draw(0, 4)];
          break;
        case 6:
          if (!in.topk_indices.empty()) cell(some(in.topk_indices)) = bad[draw(0, 3)];
          break;
        case 7:
          in.topk_indices.clear();
          break;
        case 8:
          m.num_decodes = draw(0, 1) ? B + 1 : -1;
          break;
        case 9:
          m.decode_swa_width = draw(0, 1) ? INT32_MAX : kWindow + 4;
          break;
        case 10:
          m.max_q_len = int(draw(-1, 1));
          break;
        default:  // after the values' spoils, which would write through it
          past = true;
      }
    }
    if (past) {  // a view past int64 (seq_lens), or whose bytes run past the address space
      TensorView& table = in.block_tables[0];
      if (draw(0, 1))
        in.metadata.seq_lens.shape[0] = INT64_MAX;
      else
        table = make_view(table.data, DType::i32, Device{}, {B + 1, table.size(1)},
                          {(INT64_MAX - 4 * table.size(1)) / (4 * B), 1});
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ", spoiled " + spoiled);
    const auto refused_or_ran = [&](const auto& call, const std::vector<TensorView>& outputs) {
      g.snapshot();
      try {
        call();
      } catch (const Error& e) {
        EXPECT_FALSE(e.argument().empty()) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not an smla::Error: " << e.what();
      }
      EXPECT_FALSE(g.changed(outputs)) << "a byte outside the outputs changed";
    };
    const AttentionLayer& layer = c.layers[size_t(draw(0, 3))];
    SparseIndexArgs a = c.args(layer.spec.layer);  // the step's views: the spoiled ones
    a.step = in.metadata;
    a.swa.block_table = in.block_tables[size_t(layer.spec.swa_group)];
    if (layer.spec.compress_ratio > 0) {
      const auto topk = in.topk_indices.find(layer.spec.index_source);
      if (topk != in.topk_indices.end()) a.compressed.topk_indices = topk->second;
      a.compressed.block_table = in.compressed_block_tables.at(layer.spec.kv_source);
    }
    const SparseIndexTable clean =
        test::table_outputs(c.args(layer.spec.layer),
                            [&](DType, std::initializer_list<int64_t> s) { return g.i32_out(s); });
    a.out = clean;
    refused_or_ran([&] { build_sparse_indices(a); },
                   {clean.sparse_indices, clean.sparse_topk_lens, clean.seq_lens});
    std::vector<TensorView> queries, outs;
    for (size_t i = 0; i < c.layers.size(); ++i) {
      queries.push_back(c.bf16(T, kHeads));
      outs.push_back(g.out(T, kOutHeads));
    }
    StepExecutor executor(c.layers, streams, T, 1024);
    refused_or_ran([&] { executor.run_step(in, queries, outs); }, outs);
  }
}

// A build without the CUDA backend says so when asked for CUDA streams (the executor's, the
// CLI's), rather than handing out CPU ones.
TEST(Streams, CudaWithoutTheBackendIsUnsupported) {
#if SMLA_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#else
  test::expect_smla_error(
      [] {
        make_streams(Device{DeviceKind::cuda, 0});
      },
      ErrorKind::unsupported, "device", "this build has no CUDA backend", "cuda:0");
#endif
}

// The CPU streams' zero clears every byte asked (the executor's counters and workspace; the CPU
// decode reads neither, so no decode shows it).
TEST(Streams, CpuZeroClearsEveryByte) {
  const auto streams = make_streams(Device{});
  std::vector<uint8_t> bytes(16, 0xff);
  streams->zero(bytes.data(), 13);
  for (size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], i < 13 ? 0 : 0xff) << i;
}

// One block table per SWA group a layer uses: a step with one too few is refused by name.
TEST(Executor, ABlockTableForEverySwaGroup) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 3);  // groups 0, 1, 2
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  ASSERT_EQ(specs[2].swa_group, 2);
  test::StepCase c(specs, kThreeRequests, test::fresh_seed());
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, c.num_tokens(), max_columns_of(c));
  StepInputs inputs = c.inputs;
  inputs.block_tables.pop_back();
  test::expect_smla_error([&] { executor.run_step(inputs, queries, outs); }, ErrorKind::value,
                          "block_tables", "a block table for SWA group 2", "2 block tables");
  // A compressed layer's pages and top-k, by the role of the layer that keys them, whether its
  // decode or its table's build reads them: missing, an entry is not one keyed as given, and the
  // step is refused before it builds any table.
  const auto compressed = std::ranges::find_if(specs, [](auto& s) { return s.compress_ratio; });
  ASSERT_NE(compressed, specs.end());
  for (const CompressedIndex mode :
       {CompressedIndex::table, CompressedIndex::topk, CompressedIndex::automatic}) {
    SCOPED_TRACE(compressed_index_name(mode));
    StepExecutor moded(c.layers, *streams, c.num_tokens(), max_columns_of(c), TableSharing::shared,
                       mode);
    inputs = c.inputs;
    inputs.compressed_block_tables.erase(compressed->kv_source);
    test::expect_smla_error(
        [&] { moded.run_step(inputs, queries, outs); }, ErrorKind::value, "compressed_block_tables",
        "an entry for kv source layer " + std::to_string(compressed->kv_source), "none");
    inputs = c.inputs;
    inputs.topk_indices.erase(compressed->index_source);
    test::expect_smla_error(
        [&] { moded.run_step(inputs, queries, outs); }, ErrorKind::value, "topk_indices",
        "an entry for index source layer " + std::to_string(compressed->index_source), "none");
    EXPECT_TRUE(moded.tables().stats().builds.empty()) << "a table was built for a refused step";
    EXPECT_EQ(moded.steps_begun(), 0u);
  }
}

// A query of another step's tokens or another layer's heads is the query's error, not a table's
// (T) nor taken silently with buffers sized for the layer's heads (H); metadata the decodes
// cannot read (a strided seq_lens, which the builders take) is refused before any table is built.
TEST(Executor, QueryAndMetadataShapesAreTheStepsAndLayers) {
  const auto all = model_layers(model_preset("v41-flash"), 1, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 2);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::StepCase c(
      specs,
      {.q_lens = {1, 1}, .seq_lens = {150, 90}, .num_decodes = 2, .block_size = 64, .span = 64},
      test::fresh_seed());
  const auto streams = make_streams(Device{});
  StepExecutor executor(c.layers, *streams, 4, 1024);
  executor.begin_step(c.inputs);
  const std::string expected =
      "[T = num_tokens = 2, H = num_heads = " + std::to_string(kHeads) + ", 512]";
  test::expect_smla_error([&] { executor.run_layer(1, c.bf16(4, kHeads), c.bf16(4, kHeads)); },
                          ErrorKind::value, "query", expected, "[4, " + std::to_string(kHeads));
  test::expect_smla_error(
      [&] { executor.run_layer(0, c.bf16(2, kHeads + 1), c.bf16(2, kHeads + 1)); },
      ErrorKind::value, "query", expected, "(layer 0)");
  const TensorView q = c.bf16(2, kHeads), o = c.bf16(2, kHeads);
  EXPECT_NO_THROW(executor.run_layer(0, q, o));
  executor.end_step();

  std::vector<int32_t> strided{150, -1, 90, -1};
  StepInputs inputs = c.inputs;
  inputs.metadata.seq_lens = make_view(strided.data(), DType::i32, Device{}, {2}, {2});
  StepExecutor fresh(c.layers, *streams, 4, 1024);
  const std::vector<TensorView> queries{q, c.bf16(2, kHeads)}, outs{o, c.bf16(2, kHeads)};
  test::expect_smla_error([&] { fresh.run_step(inputs, queries, outs); }, ErrorKind::value,
                          "seq_lens", "a contiguous last dim", "stride 2");
  EXPECT_TRUE(fresh.tables().stats().builds.empty()) << "a table was built for a refused step";
}

// Where its decode reads a top-k (topk mode here), the top-k and its compressed block table
// must be contiguous as the decode reads them: refused as the step begins, by the names the
// caller gave them, not as a layer's topk_columns mid-step.
TEST(Executor, TopkReadInTheDecodeIsContiguousWhenTheStepBegins) {
  const auto all = model_layers(model_preset("v41-flash"), 3, false);
  const auto compressed =
      std::ranges::find_if(all, [](const LayerSpec& s) { return s.compress_ratio > 0; });
  ASSERT_NE(compressed, all.end());
  LoggedStep logged(static_cast<size_t>(compressed - all.begin()), CompressedIndex::topk);
  const std::vector<LayerSpec>& specs = logged.specs;
  test::StepCase& c = logged.c;
  test::RecordingStreams& streams = logged.streams;
  StepExecutor& executor = logged.executor;
  SCOPED_TRACE(test::seed_note(logged.seed));
  const int64_t T = c.num_tokens();
  const LayerSpec& s = specs.back();
  executor.begin_step(c.inputs);  // an open step, whose tables a refused one leaves
  executor.run_layer(specs[0].layer, c.bf16(T, kHeads), c.bf16(T, kHeads));
  ASSERT_EQ(streams.log.back().rfind("record ", 0), 0u) << "layer 0's lookup forked nothing";
  const auto builds = executor.tables().stats().builds;
  ASSERT_FALSE(builds.empty());
  ASSERT_EQ(executor.steps_begun(), 1u);
  for (const bool block_table : {false, true}) {
    StepInputs inputs = c.inputs;
    TensorView& view = block_table ? inputs.compressed_block_tables.at(s.kv_source)
                                   : inputs.topk_indices.at(s.index_source);
    ASSERT_GT(view.size(1), 1);
    // The same values column-major.
    std::vector<int32_t> copy(static_cast<size_t>(view.numel()));
    for (int64_t i = 0; i < view.size(0); ++i)
      for (int64_t j = 0; j < view.size(1); ++j)
        copy[static_cast<size_t>(j * view.size(0) + i)] = check::at(view, i, j);
    view = make_view(copy.data(), DType::i32, Device{}, {view.size(0), view.size(1)},
                     {1, view.size(0)});
    const std::string name = block_table
                                 ? "compressed_block_tables[" + std::to_string(s.kv_source) + "]"
                                 : "topk_indices[" + std::to_string(s.index_source) + "]";
    executor.begin_step(c.inputs);  // open again, with layer 0's forks pending
    executor.run_layer(specs[0].layer, c.bf16(T, kHeads), c.bf16(T, kHeads));
    streams.log.clear();
    test::expect_smla_error([&] { executor.begin_step(inputs); }, ErrorKind::value, name,
                            "a contiguous last dim", "stride " + std::to_string(view.size(0)));
    EXPECT_EQ(executor.steps_begun(), block_table ? 3u : 2u);
    EXPECT_EQ(executor.tables().stats().builds, builds);  // nothing built, nothing reset
    EXPECT_EQ(streams.log, std::vector<std::string>{"join"});  // the open step ended joined
    test::expect_smla_error(
        [&] { executor.run_layer(specs[0].layer, c.bf16(T, kHeads), c.bf16(T, kHeads)); },
        ErrorKind::value, "run_layer", "a step begun", "no step begun");
  }
  executor.begin_step(c.inputs);  // as given, they are
  EXPECT_EQ(executor.steps_begun(), 4u);
  executor.build_tables(c.inputs);
  EXPECT_EQ(executor.steps_begun(), 5u);
}

TEST(Executor, LayersAreCheckedWhenMade) {
  const auto all = model_layers(model_preset("v41-flash"), 1, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 2);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  test::CaseShape shape{
      .q_lens = {1}, .seq_lens = {150}, .num_decodes = 1, .block_size = 64, .span = 64};
  const test::StepCase c(specs, shape, 1);
  test::RecordingStreams streams;
  // c's layers with `edit` applied are refused when the executor is made, naming the field.
  const auto refused = [&](auto edit, const char* field, const char* expected, const char* got) {
    std::vector<AttentionLayer> layers = c.layers;
    edit(layers);
    test::expect_smla_error([&] { StepExecutor(layers, streams, 1, 1024); }, ErrorKind::value,
                            field, expected, got);
  };
  using Layers = std::vector<AttentionLayer>;
  // LayerSpec's default: a spec nobody filled in
  refused([](Layers& l) { l[1].spec.num_heads = 0; }, "layers[1].spec.num_heads", "1..128", "0");
  // More heads than the kernels hold: unsupported, as the decode says of a wider query.
  std::vector<AttentionLayer> wide = c.layers;
  wide[0].spec.num_heads = 129;
  test::expect_smla_error([&] { StepExecutor(wide, streams, 1, 1024); }, ErrorKind::unsupported,
                          "layers[0].spec.num_heads", "1..128", "129");
  // None would run as given: a negative ratio as an SWA-only layer, a negative group as group
  // 2^64 - 1, a negative top-k as every compressed entry.
  refused([](Layers& l) { l[1].spec.compress_ratio = -2; }, "layers[1].spec.compress_ratio",
          ">= 0", "-2");
  refused([](Layers& l) { l[0].spec.swa_group = -1; }, "layers[0].spec.swa_group", ">= 0", "-1");
  refused([](Layers& l) { l[1].spec.index_topk = -4; }, "layers[1].spec.index_topk", ">= 0",
          "-4");
  // A window below 1 failed only as a step ran.
  refused([](Layers& l) { l[0].spec.window = 0; }, "layers[0].spec.window", ">= 1", "0");
  refused([](Layers& l) { l[1].spec.window = -5; }, "layers[1].spec.window", ">= 1", "-5");
  refused([](Layers& l) { l[0].bmm1_scale = NAN; }, "layers[0].bmm1_scale",
          "a finite float of magnitude below 2.3e38", "nan");
  refused([](Layers& l) { l[1].bmm2_scale = INFINITY; }, "layers[1].bmm2_scale", "a finite float",
          "inf");
  // A compressed layer without its pool would read the SWA pool through the compressed pages.
  refused(
      [](Layers& l) {
        l[1].spec.compress_ratio = 2;
        l[1].spec.kv_source = l[1].spec.index_source = l[1].spec.layer;
        l[1].compressed_kv_cache = {};
      },
      "layers[1].compressed_kv_cache", "its kv source's pool (compress_ratio 2)", "absent");
  // A compressed layer's sources left unset (LayerSpec's -1): its step's entries are looked up
  // by them.
  for (const char* field : {"kv_source", "index_source"})
    refused(
        [&](Layers& l) {
          l[1].spec.compress_ratio = 2;
          l[1].spec.kv_source = l[1].spec.index_source = l[1].spec.layer;
          (std::string(field) == "kv_source" ? l[1].spec.kv_source : l[1].spec.index_source) = -1;
          l[1].compressed_kv_cache = l[1].swa_kv_cache;
        },
        (std::string("layers[1].spec.") + field).c_str(),
        "a layer id >= 0 for a compressed layer (compress_ratio 2)", "-1");
  // What the layer's decode would refuse as it runs, after the layers before it wrote their outs:
  // sinks not of its heads, or not f32, a pool on another device than the streams'.
  std::vector<float> sinks(kHeads + 1);
  refused(
      [&](Layers& l) { l[1].sinks = make_view(sinks.data(), DType::f32, Device{}, {kHeads + 1}); },
      "layers[1].sinks", "[H=2]", "[3]");
  refused(
      [&](Layers& l) { l[0].sinks = make_view(sinks.data(), DType::f32, Device{}, {kHeads}, {2}); },
      "layers[0].sinks", "a contiguous last dim", "stride 2");
  test::expect_smla_error(
      [&] {
        std::vector<AttentionLayer> layers = c.layers;
        layers[0].sinks = make_view(sinks.data(), DType::i32, Device{}, {kHeads});
        StepExecutor(layers, streams, 1, 1024);
      },
      ErrorKind::type, "layers[0].sinks", "f32", "i32");
  test::expect_smla_error(
      [&] {
        std::vector<AttentionLayer> layers = c.layers;
        layers[1].swa_kv_cache.device = {DeviceKind::cuda, 0};
        StepExecutor(layers, streams, 1, 1024);
      },
      ErrorKind::type, "layers[1].swa_kv_cache", "cpu (the streams' device)", "cuda:0");
  // Pools of two layouts, which the decode refuses, are refused before any layer runs.
  {
    std::vector<AttentionLayer> layers = c.layers;
    layers[1].spec.compress_ratio = 2;
    layers[1].spec.kv_source = layers[1].spec.index_source = layers[1].spec.layer;
    TensorView& pool = layers[1].compressed_kv_cache = layers[1].swa_kv_cache;
    pool.dtype = DType::f8e4m3, pool.strides[0] *= 2, pool.strides[1] *= 2;  // its bytes' rows
    test::expect_smla_error([&] { StepExecutor(layers, streams, 1, 1024); }, ErrorKind::type,
                            "layers[1].compressed_kv_cache",
                            "bf16 (the layout of layers[1].swa_kv_cache)", "f8e4m3");
  }
  // SPEC §5's key leaves out the window and the pools' pages: one table would serve layers 0
  // and 1 (group 0, swa_only) as if theirs were equal.
  refused([](Layers& l) { l[1].spec.window = 64; }, "layers[1].spec.window",
          "layers[0]'s window 128 (SWA group 0, key swa_only: one table serves both)", "window 64");
  const auto half_pages = [](Layers& l) {
    TensorView& pool = l[1].swa_kv_cache;
    pool.shape[0] *= 2, pool.shape[1] /= 2, pool.strides[0] /= 2;
  };
  refused(half_pages, "layers[1].swa_kv_cache", "layers[0]'s block_size 64, page span 64",
          "block_size 32, page span 32");
  // Without sharing each layer builds its own table.
  for (const auto& edit : {std::function<void(Layers&)>([](Layers& l) { l[1].spec.window = 64; }),
                           std::function<void(Layers&)>(half_pages)}) {
    std::vector<AttentionLayer> layers = c.layers;
    edit(layers);
    EXPECT_NO_THROW(StepExecutor(layers, streams, 1, 1024, TableSharing::none));
  }
}

// The sizes the shared buffers are made for are refused outside 0..2^31 - 1 (workspace_bytes'
// range), with layers or without.
TEST(Executor, SizesAreCheckedWithOrWithoutLayers) {
  test::RecordingStreams streams;
  for (const int64_t bad : {int64_t{-1}, int64_t{1} << 31}) {
    test::expect_smla_error([&] { StepExecutor({}, streams, bad, 0); }, ErrorKind::value,
                            "max_tokens", "0..2^31 - 1", std::to_string(bad));
    test::expect_smla_error([&] { StepExecutor({}, streams, 0, bad); }, ErrorKind::value,
                            "max_columns", "0..2^31 - 1", std::to_string(bad));
  }
  EXPECT_NO_THROW(StepExecutor({}, streams, 0, 0));
}

// SPEC §5: the executor joins before an index source's indexer, and only there. Layers 3..7
// and 9..13 read the top-k of layers 2 and 8: each looks up a table its run's first layer
// forked, and waits for it, the fork still unjoined (a join before each would leave nothing to
// wait for, and the side stream's builds no layer to overlap).
TEST(Executor, JoinsOnlyBeforeIndexSources) {
  LoggedStep logged(13, CompressedIndex::table);
  test::StepCase& c = logged.c;
  test::RecordingStreams& streams = logged.streams;
  StepExecutor& executor = logged.executor;
  SCOPED_TRACE(test::seed_note(logged.seed));
  std::vector<TensorView> queries, outs;
  add_layer_buffers(c, queries, outs);
  executor.run_step(c.inputs, queries, outs);
  const std::vector<int> waits{1, 3, 4, 6, 7, 9, 10, 12, 13};
  EXPECT_EQ(executor.tables().stats().waits, waits);
  // Layers 0, 2 and 8 fork; the joins are before layers 2 and 8 and at the end of the step.
  EXPECT_EQ(streams.count("fork"), 3);
  EXPECT_EQ(streams.count("join"), 3);
  executor.build_tables(c.inputs);  // the same lookups without the decodes
  EXPECT_EQ(executor.tables().stats().waits, waits);
}

// A layer that reads every compressed entry has no indexer (SPEC §6: its index source is itself
// but its index_topk 0): no join before it, so group 1's forked swa_only table is still pending
// when it runs.
TEST(Executor, NoJoinBeforeALayerReadingEveryEntry) {
  const auto all = model_layers(model_preset("v4-flash"), 2, false);
  std::vector<LayerSpec> specs{all[0], all[1], all[3]};  // swa_only in groups 0, 1; ratio 128
  ASSERT_EQ(specs[2].compress_ratio, 128);
  ASSERT_EQ(specs[2].index_source, specs[2].layer);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  test::StepCase c(specs, kThreeRequests, seed);
  const int64_t T = c.num_tokens();
  test::RecordingStreams streams;
  StepExecutor executor(c.layers, streams, T, max_columns_of(c), TableSharing::shared,
                        CompressedIndex::table);
  executor.begin_step(c.inputs);
  executor.run_layer(0, c.bf16(T, kHeads), c.bf16(T, kHeads));  // forks group 1's swa_only
  executor.run_layer(1, c.bf16(T, kHeads), c.bf16(T, kHeads));
  EXPECT_EQ(streams.log.back(), "wait 0");
  executor.run_layer(3, c.bf16(T, kHeads), c.bf16(T, kHeads));
  executor.end_step();
  EXPECT_EQ(streams.count("join"), 1);  // end_step's
  EXPECT_EQ(streams.log.back(), "join");
}

// A table serves the layers of its (SWA group, key) over one compressed page geometry too:
// layers 2 and 3 (key 2:2:2, one group) with compressed pools of other pages are refused when
// the executor is made, unless each builds its own table or neither reads a table's compressed
// columns (topk: the decode reads each layer's top-k through its own pool).
TEST(Executor, CompressedPagesOfOneTableAgree) {
  const auto all = model_layers(model_preset("v41-flash"), 1, false);
  std::vector<LayerSpec> specs(all.begin(), all.begin() + 4);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  ASSERT_EQ(sparse_index_key(specs[2]), sparse_index_key(specs[3]));
  test::CaseShape shape{.q_lens = {1},
                        .seq_lens = {150},
                        .num_decodes = 1,
                        .block_size = 64,
                        .span = 64,
                        .entries_per_page = 8,
                        .compressed_span = 8};
  const test::StepCase c(specs, shape, test::fresh_seed());
  test::RecordingStreams streams;
  std::vector<AttentionLayer> layers = c.layers;
  TensorView& pool = layers[3].compressed_kv_cache;
  pool.shape[0] *= 2, pool.shape[1] /= 2, pool.strides[0] /= 2;  // pages of 4 entries
  for (const CompressedIndex mode : {CompressedIndex::table, CompressedIndex::automatic})
    test::expect_smla_error(
        [&] { StepExecutor(layers, streams, 1, 1024, TableSharing::shared, mode); },
        ErrorKind::value, "layers[3].compressed_kv_cache",
        "layers[2]'s block_size 8, page span 8 (SWA group 0, key 2:2:2: one table serves both)",
        "block_size 4, page span 4");
  EXPECT_NO_THROW(StepExecutor(layers, streams, 1, 1024, TableSharing::none));
  EXPECT_NO_THROW(
      StepExecutor(layers, streams, 1, 1024, TableSharing::shared, CompressedIndex::topk));
}

// Where the compressed columns come from a table, its builder reads the top-k and compressed
// block table at any stride: column-major copies give the step's outputs bit for bit (only a
// top-k the decode reads must be contiguous, TopkReadInTheDecodeIsContiguousWhenTheStepBegins).
TEST(Executor, TopkReadByATableBuildMayBeStrided) {
  LoggedStep logged(7, CompressedIndex::table);
  const std::vector<LayerSpec>& specs = logged.specs;
  test::StepCase& c = logged.c;
  StepExecutor& executor = logged.executor;
  SCOPED_TRACE(test::seed_note(logged.seed));
  const int64_t T = c.num_tokens();
  const LayerSpec& s = specs.back();
  ASSERT_GT(s.compress_ratio, 0);
  std::vector<TensorView> queries, outs, strided_outs;
  add_layer_buffers(c, queries, outs);
  for (size_t i = 0; i < specs.size(); ++i) strided_outs.push_back(c.bf16(T, kHeads));
  executor.run_step(c.inputs, queries, outs);
  StepInputs inputs = c.inputs;
  std::vector<int32_t> copies[2];
  for (int k = 0; k < 2; ++k) {
    TensorView* view = k ? &inputs.topk_indices.at(s.index_source)
                         : &inputs.compressed_block_tables.at(s.kv_source);
    ASSERT_GT(view->size(1), 1);
    std::vector<int32_t>& copy = copies[k];
    copy.resize(static_cast<size_t>(view->numel()));
    for (int64_t i = 0; i < view->size(0); ++i)
      for (int64_t j = 0; j < view->size(1); ++j)
        copy[static_cast<size_t>(j * view->size(0) + i)] = check::at(*view, i, j);
    *view = make_view(copy.data(), DType::i32, Device{}, {view->size(0), view->size(1)},
                      {1, view->size(0)});
  }
  executor.run_step(inputs, queries, strided_outs);
  const size_t bytes = static_cast<size_t>(T) * kHeads * kHeadDim * 2;
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(std::memcmp(strided_outs[i].data, outs[i].data, bytes), 0) << "layer " << i;
}

// Past the top-k width the decode reads on a device, layers reading every entry build their
// tables even where `auto` would have them read the top-k (each of V4-Pro's is a key of one
// layer); up to it they read it. Those layers alone, so that this holds for the limit of this
// build (2048 with CUDA, 0 without: only a width of 0 is then read).
TEST(Executor, EveryEntryLayersPastTheDeviceLimitBuildTables) {
  std::vector<LayerSpec> specs;
  for (const LayerSpec& s : model_layers(model_preset("v4-pro"), 2))
    if (s.compress_ratio > 0 && s.index_topk == 0) specs.push_back(s);
  ASSERT_GT(specs.size(), 2u);
  const Device cuda{DeviceKind::cuda, 0};
  const int64_t limit = max_topk_width(cuda);
  const auto tables_read = [&](CompressedIndex mode, int64_t every_entry_width) {
    int64_t read = 0;
    for (const LayerSpec& s :
         table_specs(specs, mode, TableSharing::shared, every_entry_width, cuda))
      read += s.compress_ratio > 0;
    return read;
  };
  const auto all = static_cast<int64_t>(specs.size());
  EXPECT_EQ(tables_read(CompressedIndex::automatic, limit), 0);
  EXPECT_EQ(tables_read(CompressedIndex::automatic, limit + 1), all);
  EXPECT_EQ(tables_read(CompressedIndex::table, limit), all);
  EXPECT_EQ(tables_read(CompressedIndex::topk, limit), 0);
  test::expect_smla_error([&] { tables_read(CompressedIndex::topk, limit + 1); },
                          ErrorKind::unsupported, "compressed_index",
                          "top-k widths up to " + std::to_string(limit),
                          "layers[0] (layer 0) reading up to " + std::to_string(limit + 1));
}

INSTANTIATE_TEST_SUITE_P(
    Steps, ExecutorMatchesDirectCalls,
    testing::Values(
        // MTP decode (q_len 1..3) with padding tokens, three SWA groups, ratios 0 and 2.
        Case{"v41-flash",
             3,
             0,
             10,
             {.q_lens = {1, 3, 2},
              .seq_lens = {300, 200, 40},
              .num_decodes = 3,
              .num_groups = 3,
              .invalid_fraction = 0.2}},
        // Decode and prefill requests in one step, two groups, ratios 0, 4 and 128.
        Case{"v4-flash",
             2,
             0,
             8,
             {.q_lens = {2, 1, 20},
              .seq_lens = {700, 150, 300},
              .num_decodes = 2,
              .num_groups = 2,
              .block_size = 64,
              .span = 80}},
        // The DSpark window on the SWA-only MTP layers.
        Case{"v41-flash",
             3,
             40,
             3,
             {.q_lens = {3, 3},
              .seq_lens = {500, 90},
              .num_decodes = 2,
              .num_groups = 3,
              .decode_swa_width = 192}},
        // Layers whose index source is not their kv source (24..27: kv 20, top-k 24), in runs
        // that read the top-k in the decode; prefill rows' top-k past what a token sees is not
        // -1 (a prefill row reads its first (pos + 1) / ratio entries, not those >= 0).
        Case{"v41-flash",
             3,
             20,
             8,
             {.q_lens = {1, 3, 12},
              .seq_lens = {700, 200, 150},
              .num_decodes = 2,
              .num_groups = 3,
              .invalid_fraction = 0.2,
              .topk_tails = true}},
        // Every layer's window 64, not the default W: tables and decodes both use the layer's.
        Case{"v4-flash",
             2,
             0,
             8,
             {.q_lens = {2, 1, 20},
              .seq_lens = {700, 150, 300},
              .num_decodes = 2,
              .num_groups = 2,
              .block_size = 64,
              .span = 80,
              .topk_tails = true},
             64}));

}  // namespace
}  // namespace smla
