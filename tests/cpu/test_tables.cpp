// Sharing tables across a step's layers (SPEC §5) over the model layer patterns (SPEC §6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "case_gen.h"
#include "cpu/streams.h"
#include "error_check.h"
#include "recording_streams.h"
#include "smla/error.h"
#include "smla/tables.h"
#include "step_case.h"

namespace smla {
namespace {

bool runs_indexer(const LayerSpec& s) {
  return s.compress_ratio > 0 && s.index_topk > 0 && s.index_source == s.layer;
}

test::CaseShape small_step(int groups) {
  return {.q_lens = {1, 2, 1},
          .seq_lens = {150, 260, 40},
          .num_decodes = 3,
          .num_groups = groups,
          .block_size = 64,
          .span = 64};
}

// A step of `layers` on fresh random inputs, and tables over streams that log each ordering
// call. The test names `seed` in a SCOPED_TRACE. Lambdas capture its members (`&c = logged.c`),
// not the tests' structured bindings of them, which Clang before 16 cannot capture.
struct LoggedStep {
  LoggedStep(std::vector<LayerSpec> specs, int groups)
      : layers(std::move(specs)), c(layers, small_step(groups), seed), tables(layers, streams) {}
  std::vector<LayerSpec> layers;
  uint64_t seed = test::fresh_seed();
  test::StepCase c;
  test::RecordingStreams streams;
  SparseIndexTables tables;
};

// The rows of a table, copied out (a table's memory goes when its group moves on).
std::vector<int32_t> contents(const SparseIndexTable& t) {
  const int32_t* i = t.sparse_indices.ptr<int32_t>();
  const int32_t* n = t.sparse_topk_lens.ptr<int32_t>();
  std::vector<int32_t> all(i, i + t.sparse_indices.numel());
  all.insert(all.end(), n, n + t.sparse_topk_lens.numel());
  return all;
}

std::vector<int32_t> direct(const test::StepCase& c, int layer) {
  SparseIndexArgs a = c.args(layer);
  const int64_t T = c.num_tokens(), K = sparse_index_columns(a);
  std::vector<int32_t> all(T * K + T);
  a.out.sparse_indices = make_view(all.data(), DType::i32, Device{}, {T, K});
  a.out.sparse_topk_lens = make_view(all.data() + T * K, DType::i32, Device{}, {T});
  build_sparse_indices(a);
  return all;
}

// Looks every layer up in order as the executor does (joining at index sources), checking
// each table against a direct build of that layer's own.
void run_step(SparseIndexTables& tables, const test::StepCase& c,
              const std::vector<LayerSpec>& layers) {
  tables.reset();
  const TableInputs inputs = [&](int layer) { return c.args(layer); };
  for (const LayerSpec& s : layers) {
    if (runs_indexer(s)) tables.join();
    ASSERT_EQ(contents(tables.lookup(s.layer, inputs)), direct(c, s.layer)) << "layer " << s.layer;
  }
  tables.join();
}

// A table's memory: [T, K] indices and [T] lengths, and in DSpark [T] seq_lens (i32 each).
size_t table_bytes(const test::StepCase& c, int layer) {
  const SparseIndexArgs a = c.args(layer);
  const int64_t T = c.num_tokens();
  const bool dspark = a.step.decode_swa_width > a.window;
  return sizeof(int32_t) * static_cast<size_t>(T * sparse_index_columns(a) + T + (dspark ? T : 0));
}

// SPEC §5's bound on memory, replayed store by store: a new key in a group (swa_only too)
// drops that group's previous compressed table and nothing else (no other group's, no swa_only
// one).
class HeldTables {
 public:
  void store(const TableKey& key, size_t bytes) {
    std::erase_if(held_, [&](const auto& entry) {
      const auto& [group, name] = entry.first;
      return group == key.first && name != "swa_only" && name != key.second;
    });
    held_[key] = bytes;
    bytes_ = 0;
    for (const auto& [k, b] : held_) bytes_ += b;
    peak_ = std::max(peak_, bytes_);
  }
  bool holds(const TableKey& key) const { return held_.contains(key); }
  size_t bytes() const { return bytes_; }
  size_t peak() const { return peak_; }

 private:
  std::map<TableKey, size_t> held_;
  size_t bytes_ = 0, peak_ = 0;
};

// SPEC §5 stated per run of equal keys: of the groups whose table the run needs and that do
// not have it yet, the first (in layer order) builds on the current stream and its layer
// forks the others.
struct Run {
  size_t first = 0, end = 0;
  int leader = -1;  // the layer that builds and forks; -1: every table was there
  std::vector<TableKey> forks{};
};

std::vector<Run> expected_runs(const std::vector<LayerSpec>& layers) {
  std::set<TableKey> built;
  std::vector<Run> runs;
  for (size_t first = 0, end; first < layers.size(); first = end) {
    Run run{.first = first};
    const std::string key = sparse_index_key(layers[first]);
    for (end = first; end < layers.size() && sparse_index_key(layers[end]) == key; ++end) {
      const TableKey k{layers[end].swa_group, key};
      if (built.contains(k)) continue;
      built.insert(k);
      if (run.leader < 0)
        run.leader = layers[end].layer;
      else
        run.forks.push_back(k);
    }
    run.end = end;
    runs.push_back(run);
  }
  return runs;
}

std::vector<TableKey> expected_forks(const std::vector<LayerSpec>& layers) {
  std::vector<TableKey> forks{};
  for (const Run& run : expected_runs(layers))
    forks.insert(forks.end(), run.forks.begin(), run.forks.end());
  return forks;
}

// A lookup waits when its table was forked after the last join (joins at index sources).
std::vector<int> expected_waits(const std::vector<LayerSpec>& layers) {
  std::set<TableKey> pending;
  std::vector<int> waits;
  for (const Run& run : expected_runs(layers)) {
    for (size_t i = run.first; i < run.end; ++i) {
      const LayerSpec& s = layers[i];
      if (runs_indexer(s)) pending.clear();
      if (s.layer == run.leader)
        pending.insert(run.forks.begin(), run.forks.end());
      else if (pending.contains({s.swa_group, sparse_index_key(s)}))
        waits.push_back(s.layer);
    }
  }
  return waits;
}

TEST(SparseIndexKey, SwaOnlyOrCacheSourceRatio) {
  const auto flash = model_layers(model_preset("v4-flash"), 1);
  EXPECT_EQ(sparse_index_key(flash[0]), "swa_only");
  EXPECT_EQ(sparse_index_key(flash[2]), "2:2:4");
  EXPECT_EQ(sparse_index_key(flash[3]), "3:3:128");
  const auto v41 = model_layers(model_preset("v41-flash"), 1);
  EXPECT_EQ(sparse_index_key(v41[7]), "2:2:2");
  EXPECT_EQ(sparse_index_key(v41[27]), "20:24:1");
  EXPECT_EQ(sparse_index_key(v41[39]), "20:36:1");
  EXPECT_EQ(sparse_index_key(v41[39], TableSharing::none), "layer 39");
  EXPECT_EQ(sparse_index_key(flash[0], TableSharing::none), "layer 0");
  // A cast int is no sharing mode (it read as shared).
  test::expect_smla_error([&] { sparse_index_key(flash[2], static_cast<TableSharing>(9)); },
                          ErrorKind::value, "sharing", "TableSharing::shared or", "9");
}

// A spec topk_width refuses has no key either (it came back as "-1:-1:-1"), with either sharing.
TEST(SparseIndexKey, RefusesTheSpecsTopkWidthRefuses) {
  const auto refused = [](LayerSpec s, const char* field, const char* expected, const char* got) {
    for (TableSharing sharing : {TableSharing::shared, TableSharing::none})
      test::expect_smla_error([&] { sparse_index_key(s, sharing); }, ErrorKind::value, field,
                              expected, got);
    test::expect_smla_error([&] { topk_width(s, 1024); }, ErrorKind::value, field, expected, got);
  };
  refused({.compress_ratio = -1}, "layer.compress_ratio", ">= 0 (0: SWA-only)", "-1");
  refused({.compress_ratio = 4, .kv_source = 2, .index_source = 2, .index_topk = -8},
          "layer.index_topk", ">= 0 (0: every compressed entry)", "-8");
  refused({.window = 0}, "layer.window", ">= 1", "0");
  refused({.compress_ratio = 4, .window = -5}, "layer.window", ">= 1", "-5");
}

TEST(ModelPresets, ShapesOfSpec6) {
  const auto flash = model_layers(model_preset("v4-flash"), 2, true);
  ASSERT_EQ(flash.size(), 44u);
  EXPECT_EQ(flash[42].compress_ratio, 4);
  EXPECT_TRUE(flash[43].mtp);
  EXPECT_EQ(flash[43].compress_ratio, 0);
  EXPECT_EQ(flash[5].swa_group, 1);
  EXPECT_EQ(flash[3].index_topk, 0);  // ratio 128: every compressed entry
  // As wide as the entries its longest request sees: position p sees (p + 1) / ratio, so
  // max_seq_len / ratio, rounded down (SPEC §4).
  const std::pair<int64_t, int64_t> widths[] = {{4096, 32}, {4095, 31}, {4097, 32},
                                                {127, 0},   {128, 1},   {0, 0}};
  for (const auto& [seq_len, width] : widths)
    EXPECT_EQ(topk_width(flash[3], seq_len), width) << "max_seq_len " << seq_len;
  EXPECT_EQ(topk_width(flash[2], 4096), 512);
  EXPECT_EQ(topk_width(flash[2], 4095), 512);  // an indexed layer: its index_topk
  // A negative length or ratio has no width (ratio 128, -500: -3 before; -1, the first).
  for (const int seq_len : {-500, -1})
    test::expect_smla_error([&] { topk_width(flash[3], seq_len); }, ErrorKind::value, "max_seq_len",
                            ">= 0", std::to_string(seq_len));
  LayerSpec negative = flash[3];
  for (const int ratio : {-4, -1}) {  // -1 too: the first below the SWA-only 0
    negative.compress_ratio = ratio;
    test::expect_smla_error([&] { topk_width(negative, 4096); }, ErrorKind::value,
                            "layer.compress_ratio", ">= 0", std::to_string(ratio));
  }
  negative = flash[2];
  negative.index_topk = -512;  // not "every compressed entry", which is 0
  test::expect_smla_error([&] { topk_width(negative, 4096); }, ErrorKind::value,
                          "layer.index_topk", ">= 0", "-512");
  const auto pro = model_layers(model_preset("v4-pro"), 1);
  ASSERT_EQ(pro.size(), 61u);
  EXPECT_EQ(pro[0].num_heads, 128);
  EXPECT_EQ(pro[0].compress_ratio, 128);
  EXPECT_EQ(pro[0].index_topk, 0);  // ratio 128: every compressed entry, no indexer of its own
  EXPECT_EQ(topk_width(pro[0], 4096), 32);
  EXPECT_EQ(pro[60].compress_ratio, 4);
  EXPECT_EQ(pro[60].index_topk, 1024);
  const auto v41 = model_layers(model_preset("v41-flash"), 3, true);
  ASSERT_EQ(v41.size(), 43u);
  EXPECT_EQ(v41[19].compress_ratio, 2);
  EXPECT_EQ(v41[20].compress_ratio, 1);
  EXPECT_EQ(v41[25].kv_source, 20);
  EXPECT_EQ(v41[25].index_source, 24);
  EXPECT_EQ(v41[13].kv_source, 8);
  EXPECT_EQ(v41[42].compress_ratio, 0);
  EXPECT_EQ(v41[4].swa_group, 1);
  test::expect_smla_error([] { model_preset("v5"); }, ErrorKind::value, "name", "one of v4-flash",
                          "v5");
  // Groups are dealt round-robin: none would divide by zero.
  for (const int groups : {0, -3})
    test::expect_smla_error([&] { model_layers(model_preset("v4-flash"), groups); },
                            ErrorKind::value, "num_swa_groups", ">= 1", std::to_string(groups));
}

// A preset built by hand is checked before it is read: a ratio list of another length, or a
// negative count, names the field (not a vector's range error, nor an empty model).
TEST(ModelPresets, MalformedPresetsNameTheirField) {
  ModelPreset preset = model_preset("v4-flash");
  preset.num_layers = 3;
  preset.num_mtp_layers = 0;
  preset.compress_ratios = {0};
  test::expect_smla_error([&] { model_layers(preset, 1); }, ErrorKind::value, "compress_ratios",
                          "num_layers + num_mtp_layers = 3 entries", "1 entries");
  preset.compress_ratios = {0, 4, 128};
  EXPECT_EQ(model_layers(preset, 1).size(), 3u);
  preset.num_mtp_layers = -1;
  test::expect_smla_error([&] { model_layers(preset, 1); }, ErrorKind::value, "num_mtp_layers",
                          ">= 0", "-1");
  preset.num_mtp_layers = 0;
  preset.num_layers = -3;
  test::expect_smla_error([&] { model_layers(preset, 1); }, ErrorKind::value, "num_layers", ">= 0",
                          "-3");
}

// SPEC §6's figures of each preset: query heads, index top-k, window.
TEST(ModelPresets, HeadsTopkAndWindowOfSpec6) {
  const struct {
    const char* name;
    int heads, topk;
  } figures[] = {{"v4-flash", 64, 512}, {"v4-pro", 128, 1024}, {"v41-flash", 64, 512}};
  for (const auto& [name, heads, topk] : figures) {
    SCOPED_TRACE(name);
    const ModelPreset& preset = model_preset(name);
    EXPECT_EQ(preset.num_heads, heads);
    EXPECT_EQ(preset.index_topk, topk);
    EXPECT_EQ(preset.window, 128);
    for (const LayerSpec& s : model_layers(preset, 1, true)) {
      EXPECT_EQ(s.num_heads, heads) << "layer " << s.layer;
      EXPECT_EQ(s.window, 128) << "layer " << s.layer;
      // An indexed compressed layer's top-k; 0 for SWA-only layers and those reading every entry.
      const bool indexed = s.compress_ratio > 0 && s.compress_ratio != preset.every_entry_ratio;
      EXPECT_EQ(s.index_topk, indexed ? topk : 0) << "layer " << s.layer;
    }
  }
}

TEST(SparseIndexTables, V41ThreeGroupsByHand) {
  LoggedStep logged(model_layers(model_preset("v41-flash"), 3), 3);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  run_step(tables, c, layers);
  // Layer 0 (group 0) forks group 1's swa_only table; each compressed run's first layer forks
  // the two other groups' tables.
  const std::vector<TableKey> forks{{1, "swa_only"}, {0, "2:2:2"},   {1, "2:2:2"},   {0, "8:8:2"},
                                    {1, "8:8:2"},    {0, "14:14:2"}, {1, "14:14:2"}, {0, "20:20:1"},
                                    {1, "20:20:1"},  {1, "20:24:1"}, {2, "20:24:1"}, {2, "20:28:1"},
                                    {0, "20:28:1"},  {0, "20:32:1"}, {1, "20:32:1"}, {1, "20:36:1"},
                                    {2, "20:36:1"}};
  EXPECT_EQ(tables.stats().forks, forks);
  const std::vector<int> waits{1,  3,  4,  6,  7,  9,  10, 12, 13, 15, 16, 18,
                               19, 21, 22, 25, 26, 29, 30, 33, 34, 37, 38};
  EXPECT_EQ(tables.stats().waits, waits);
  EXPECT_EQ(streams.log.front(), "reserve 2");  // events reused across forks
  for (const std::string& entry : streams.log)
    EXPECT_TRUE(entry.rfind("record", 0) != 0 || entry == "record 0" || entry == "record 1");
  EXPECT_EQ(streams.log.back(), "join");
  // Each hit on a forked table made the stream wait (SPEC §5) on the slot recorded right after
  // that table's build: a fork's n-th build (stats' forks, in order) records slot n.
  std::map<int, int> slot_of_group;  // in the latest fork that built the group's table
  size_t built = 0, waited = 0;
  int slot = 0;
  for (const std::string& entry : streams.log) {
    if (entry == "fork") slot = 0;
    if (entry.rfind("record ", 0) == 0) {
      ASSERT_LT(built, forks.size());
      EXPECT_EQ(entry, "record " + std::to_string(slot));
      slot_of_group[forks[built++].first] = slot++;
    }
    if (entry.rfind("wait ", 0) != 0) continue;
    ASSERT_LT(waited, waits.size());
    const int group = layers[static_cast<size_t>(waits[waited++])].swa_group;
    EXPECT_EQ(entry, "wait " + std::to_string(slot_of_group.at(group)))
        << "layer " << waits[waited - 1] << " (group " << group << ")";
  }
  EXPECT_EQ(built, forks.size());
  EXPECT_EQ(waited, waits.size());
}

struct Pattern {
  const char* model;
  int groups;
  friend std::ostream& operator<<(std::ostream& os, const Pattern& p) {
    return os << p.model << " with " << p.groups << " SWA groups";
  }
};

class TablesOverPatterns : public testing::TestWithParam<Pattern> {};

TEST_P(TablesOverPatterns, EachTableBuiltOnceForkedAsSpecSays) {
  const auto [model, groups] = GetParam();
  LoggedStep logged(model_layers(model_preset(model), groups, true), groups);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  for (int step = 0; step < 2; ++step) {  // reset between steps: the same work again
    run_step(tables, c, layers);
    const TableStats& stats = tables.stats();
    std::map<TableKey, int> once;
    for (const LayerSpec& s : layers) once[{s.swa_group, sparse_index_key(s)}] = 1;
    EXPECT_EQ(stats.builds, once);
    EXPECT_EQ(stats.forks, expected_forks(layers));
    EXPECT_EQ(stats.waits, expected_waits(layers));
    if (groups == 1) {
      EXPECT_TRUE(stats.forks.empty());
    }
    // Bounded memory: a group holds its swa_only table and at most one compressed one.
    for (const auto& [group, peak] : stats.peak_tables) EXPECT_LE(peak, 2) << "group " << group;
    EXPECT_GT(stats.bytes, 0u);
    EXPECT_LE(stats.bytes, stats.peak_bytes);
  }
  tables.reset();
  EXPECT_EQ(tables.stats().bytes, 0u);
  EXPECT_TRUE(tables.stats().builds.empty());
}

// After each lookup, the tables a group holds are its swa_only one and the last compressed key
// stored in it (built on a lookup, or by a fork): the memory of every layer looked up so far is
// there exactly when its (group, key) is, and the bytes and peak bytes are theirs.
TEST_P(TablesOverPatterns, AGroupDropsOnlyItsOwnPreviousTable) {
  const auto [model, groups] = GetParam();
  LoggedStep logged(model_layers(model_preset(model), groups, true), groups);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  const auto key_of = [](const LayerSpec& s) { return TableKey{s.swa_group, sparse_index_key(s)}; };
  // A layer of the step that looks `key` up (all of them build tables of one size).
  const auto layer_of = [&, &layers = logged.layers](const TableKey& key) {
    const auto it =
        std::ranges::find_if(layers, [&](const LayerSpec& s) { return key_of(s) == key; });
    return it == layers.end() ? -1 : it->layer;
  };
  tables.reset();
  const TableInputs inputs = [&c = logged.c](int layer) { return c.args(layer); };
  HeldTables held;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& s = layers[i];
    if (runs_indexer(s)) tables.join();
    const size_t forked = tables.stats().forks.size();
    const bool hit = held.holds(key_of(s));
    tables.lookup(s.layer, inputs);
    if (!hit) held.store(key_of(s), table_bytes(c, s.layer));
    const auto& forks = tables.stats().forks;
    for (size_t f = forked; f < forks.size(); ++f) {
      ASSERT_GE(layer_of(forks[f]), 0) << forks[f].second;
      held.store(forks[f], table_bytes(c, layer_of(forks[f])));
    }
    for (size_t j = 0; j <= i; ++j)
      EXPECT_EQ(tables.memory(layers[j].layer) != nullptr, held.holds(key_of(layers[j])))
          << "layer " << layers[j].layer << "'s table after layer " << s.layer << "'s lookup";
    EXPECT_EQ(tables.stats().bytes, held.bytes()) << "after layer " << s.layer;
    EXPECT_EQ(tables.stats().peak_bytes, held.peak()) << "after layer " << s.layer;
  }
  tables.join();
}

// Every layer's table, copied out as the step looks it up (joining at index sources).
std::vector<std::vector<int32_t>> step_tables(SparseIndexTables& tables, const test::StepCase& c,
                                              const std::vector<LayerSpec>& layers) {
  tables.reset();
  const TableInputs inputs = [&](int layer) { return c.args(layer); };
  std::vector<std::vector<int32_t>> all;
  for (const LayerSpec& s : layers) {
    if (runs_indexer(s)) tables.join();
    all.push_back(contents(tables.lookup(s.layer, inputs)));
  }
  tables.join();
  return all;
}

// Without sharing every layer builds its own table, on the current stream (no fork, no event,
// no wait), bit-identical to the shared one and to its own direct build; a group holds one
// table at a time.
TEST_P(TablesOverPatterns, WithoutSharingEveryLayerBuildsAlone) {
  const auto [model, groups] = GetParam();
  const auto layers = model_layers(model_preset(model), groups, true);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const test::StepCase c(layers, small_step(groups), seed);
  test::RecordingStreams shared_streams, streams;
  SparseIndexTables shared(layers, shared_streams);
  SparseIndexTables alone(layers, streams, TableSharing::none);
  EXPECT_EQ(step_tables(alone, c, layers), step_tables(shared, c, layers));
  run_step(alone, c, layers);  // against direct builds

  const TableStats& stats = alone.stats();
  std::map<TableKey, int> each_layer;
  for (const LayerSpec& s : layers)
    each_layer[{s.swa_group, "layer " + std::to_string(s.layer)}] = 1;
  EXPECT_EQ(stats.builds, each_layer);
  EXPECT_TRUE(stats.forks.empty());
  EXPECT_TRUE(stats.waits.empty());
  EXPECT_EQ(streams.log, std::vector<std::string>{"reserve 0"});
  for (const auto& [group, peak] : stats.peak_tables) EXPECT_EQ(peak, 1) << "group " << group;
}

INSTANTIATE_TEST_SUITE_P(Models, TablesOverPatterns,
                         testing::Values(Pattern{"v4-flash", 1}, Pattern{"v4-flash", 2},
                                         Pattern{"v4-flash", 3}, Pattern{"v41-flash", 1},
                                         Pattern{"v41-flash", 2}, Pattern{"v41-flash", 3},
                                         Pattern{"v4-pro", 2}),
                         [](const auto& info) {
                           std::string name = info.param.model;
                           std::erase(name, '-');
                           return name + "_" + std::to_string(info.param.groups) + "groups";
                         });

TEST(SparseIndexTables, ErrorInAForkJoinsBeforePropagating) {
  LoggedStep logged(model_layers(model_preset("v41-flash"), 2), 2);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  tables.reset();
  // Layer 3, in group 1, is the fork target of the run that layer 2 leads.
  const TableInputs inputs = [&c = logged.c](int layer) {
    SparseIndexArgs a = c.args(layer);
    if (layer == 3) a.swa.block_table.dtype = DType::f32;
    return a;
  };
  tables.lookup(0, inputs);
  tables.lookup(1, inputs);
  tables.join();
  streams.log.clear();
  try {
    tables.lookup(2, inputs);
    FAIL() << "the fork's error did not propagate";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "block_table");
    // Raised in layer 2's lookup, it names the forked table's layer and group.
    EXPECT_NE(e.got().find("(the table of layer 3, SWA group 1)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(streams.log, (std::vector<std::string>{"fork", "join"}));
  EXPECT_EQ(tables.stats().builds.at({0, "2:2:2"}), 1);
  tables.join();  // already joined: nothing more to wait for
  EXPECT_EQ(streams.log.size(), 2u);
}

// A forked table that no lookup waited for, dropped when its group stores the next key: the
// current stream, which hands its block out next, waits for the fork first.
TEST(SparseIndexTables, DroppedForkedTableIsWaitedFor) {
  LoggedStep logged(model_layers(model_preset("v41-flash"), 2), 2);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  const TableInputs inputs = [&c = logged.c](int layer) { return c.args(layer); };
  tables.lookup(0, inputs);
  tables.lookup(1, inputs);
  tables.join();
  streams.log.clear();
  tables.lookup(2, inputs);  // group 0 leads "2:2:2" and forks group 1's table (layer 3's)
  ASSERT_EQ(tables.stats().forks.back(), (TableKey{1, "2:2:2"}));
  tables.lookup(9, inputs);  // group 1's next key, layer 3 never looked up
  ASSERT_EQ(layers[9].swa_group, 1);
  EXPECT_EQ(streams.log, (std::vector<std::string>{"fork", "record 0", "wait 0", "fork",
                                                    "record 0"}));
}

// peak_bytes is the most table memory held at once: a drop to fewer bytes leaves it.
TEST(SparseIndexTables, PeakBytesOutlastADrop) {
  LoggedStep logged(model_layers(model_preset("v4-flash"), 1, true), 1);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  const TableInputs inputs = [&c = logged.c](int layer) { return c.args(layer); };
  size_t most = 0;
  int drops = 0;
  for (const LayerSpec& s : layers) {
    const size_t before = tables.stats().bytes;
    tables.lookup(s.layer, inputs);
    const size_t now = tables.stats().bytes;
    drops += now < before;
    most = std::max(most, now);
    EXPECT_EQ(tables.stats().peak_bytes, most) << "after layer " << s.layer;
  }
  // Each ratio-128 table (top-k as wide as the step's entries) replaces a wider ratio-4 one.
  EXPECT_GT(drops, 0);
}

// decode_swa_width up to W is causal (DSpark is > W): each table is its layer's direct build,
// with no seq_lens, W included.
TEST(SparseIndexTables, WidthUpToTheWindowIsCausal) {
  const auto layers = model_layers(model_preset("v4-flash"), 2, true);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (const int width : {kWindow, std::uniform_int_distribution<int>(1, kWindow)(rng)}) {
    test::CaseShape shape = small_step(2);
    shape.decode_swa_width = width;
    const test::StepCase c(layers, shape, rng());
    test::RecordingStreams streams;
    SparseIndexTables tables(layers, streams);
    run_step(tables, c, layers);
    for (const LayerSpec& s : layers)
      EXPECT_FALSE(tables.lookup(s.layer, [&](int l) { return c.args(l); }).seq_lens.defined())
          << "layer " << s.layer << " width " << width;
  }
}

// A DSpark table holds its per-token seq_lens too: [T, K] indices, [T] lengths and [T] seq_lens
// (each token's request's), all three inside the one allocation its bytes count.
TEST(SparseIndexTables, DsparkTableHoldsItsSeqLens) {
  const auto all = model_layers(model_preset("v41-flash"), 1, true);
  const std::vector<LayerSpec> layers(all.end() - 3, all.end());  // the SWA-only MTP layers
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const test::StepCase c(layers, test::random_dspark_shape(rng, static_cast<int>(seed % 2)), rng());
  test::RecordingStreams streams;
  SparseIndexTables tables(layers, streams);
  const int layer = layers[0].layer;
  const SparseIndexTable t = tables.lookup(layer, [&](int l) { return c.args(l); });
  ASSERT_TRUE(t.seq_lens.defined());
  EXPECT_EQ(tables.stats().bytes, table_bytes(c, layer));
  const auto* begin = static_cast<const std::byte*>(tables.memory(layer).get());
  const auto* end = begin + tables.stats().bytes;
  for (const TensorView* v : {&t.sparse_indices, &t.sparse_topk_lens, &t.seq_lens}) {
    const auto* data = static_cast<const std::byte*>(v->data);
    EXPECT_TRUE(data >= begin && data + v->numel() * sizeof(int32_t) <= end)
        << v->numel() << " elements at byte " << data - begin << " of " << end - begin;
  }
  for (int i = 0; i < c.num_tokens(); ++i)
    EXPECT_EQ(t.seq_lens.ptr<const int32_t>()[i],
              c.inputs.metadata.seq_lens.ptr<const int32_t>()[c.request(i)])
        << "token " << i;
}

// A key can come back to a group after another key dropped its table there (keys 0:0:2, then
// 2:0:2, then 0:0:2 again in group 1): it is built again on the current stream, and a hit on it
// waits for nothing. Its first table was forked, and waited for as it was dropped; an event kept
// for it would make the later hit wait as if this table were a fork's.
TEST(SparseIndexTables, AKeyBackInItsGroupIsBuiltOnTheCurrentStream) {
  const LayerSpec a{
      .compress_ratio = 2, .kv_source = 0, .index_source = 0, .index_topk = 16, .num_heads = 1};
  LayerSpec other = a;
  other.kv_source = 2;  // another cache, the same top-k: another key
  std::vector<LayerSpec> layers{a, a, other, a, a};
  const int groups[] = {0, 1, 1, 1, 1};
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].layer = static_cast<int>(i);
    layers[i].swa_group = groups[i];
  }
  LoggedStep logged(layers, 2);
  auto& [specs, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  ASSERT_EQ(sparse_index_key(layers[2]), "2:0:2");
  run_step(tables, c, layers);  // each table its layer's direct build
  const TableStats& stats = tables.stats();
  EXPECT_EQ(stats.forks, (std::vector<TableKey>{{1, "0:0:2"}}));
  EXPECT_EQ(stats.builds,
            (std::map<TableKey, int>{{{0, "0:0:2"}, 1}, {{1, "0:0:2"}, 2}, {{1, "2:0:2"}, 1}}));
  EXPECT_EQ(stats.waits, std::vector<int>{1});  // layer 4's table is layer 3's, not the fork's
  // Layer 1 waits for the fork, layer 2's store for it again as it drops the forked table.
  EXPECT_EQ(streams.log, (std::vector<std::string>{"reserve 1", "fork", "record 0", "wait 0",
                                                   "wait 0", "join"}));
}

// Layer ids strictly increase (runs and lookups go by them): a repeated or falling id is refused.
TEST(SparseIndexTables, LayerIdsMustIncrease) {
  const auto flash = model_layers(model_preset("v4-flash"), 2);
  test::RecordingStreams streams;
  const auto refused = [&](std::vector<LayerSpec> layers, const char* got) {
    test::expect_smla_error([&] { SparseIndexTables tables(layers, streams); }, ErrorKind::value,
                            "layers", "strictly increasing layer ids", got);
  };
  refused({flash[0], flash[0]}, "0 then 0");
  refused({flash[1], flash[0]}, "1 then 0");
  refused({flash[0], flash[2], flash[3], flash[3], flash[4]}, "3 then 3");  // the same key
  refused({flash[0], flash[2], flash[4], flash[3]}, "4 then 3");
}

// Each spec is checked as the tables are made, named by its position (a window below 1 failed
// only in a lookup's build, a negative ratio ran as SWA-only).
TEST(SparseIndexTables, SpecsAreCheckedWhenMade) {
  const auto flash = model_layers(model_preset("v4-flash"), 2);
  test::RecordingStreams streams;
  const auto refused = [&](size_t i, auto edit, const char* field, const char* expected,
                           const char* got) {
    std::vector<LayerSpec> layers(flash.begin(), flash.begin() + 4);
    edit(layers[i]);
    test::expect_smla_error([&] { SparseIndexTables tables(layers, streams); }, ErrorKind::value,
                            field, expected, got);
  };
  refused(
      1, [](LayerSpec& s) { s.window = 0; }, "layers[1].window", ">= 1", "0");
  refused(
      2, [](LayerSpec& s) { s.window = -5; }, "layers[2].window", ">= 1", "-5");
  refused(
      0, [](LayerSpec& s) { s.compress_ratio = -1; }, "layers[0].compress_ratio",
      ">= 0 (0: SWA-only)", "-1");
  refused(
      3, [](LayerSpec& s) { s.index_topk = -1; }, "layers[3].index_topk",
      ">= 0 (0: every compressed entry)", "-1");
}

// SPEC §5's key leaves the window out: layers of one group and key with other windows would
// share a table of the first one's width and SWA columns (the executor checked it; the tables,
// which C++ and Python callers make alone, did not). Other groups, and without sharing every
// layer, have tables of their own.
TEST(SparseIndexTables, OneWindowPerTable) {
  test::RecordingStreams streams;
  const LayerSpec swa{.layer = 0, .num_heads = 1}, ratio4{.layer = 1,
                                                          .compress_ratio = 4,
                                                          .kv_source = 1,
                                                          .index_source = 1,
                                                          .index_topk = 8,
                                                          .num_heads = 1};
  const auto with = [](LayerSpec s, int layer, int group, int window) {
    s.layer = layer, s.swa_group = group, s.window = window;
    return s;
  };
  using Layers = std::vector<LayerSpec>;
  test::expect_smla_error(
      [&] {
        SparseIndexTables tables(Layers{swa, with(swa, 1, 1, 64), with(swa, 2, 0, 64)}, streams);
      },
      ErrorKind::value, "layers[2].window",
      "layers[0]'s window 128 (SWA group 0, key swa_only: one table serves both)", "window 64");
  test::expect_smla_error(
      [&] {
        SparseIndexTables tables(Layers{ratio4, with(ratio4, 2, 0, 32)}, streams);
      },
      ErrorKind::value, "layers[1].window",
      "layers[0]'s window 128 (SWA group 0, key 1:1:4: one table serves both)", "window 32");
  EXPECT_NO_THROW(SparseIndexTables(Layers{swa, with(swa, 1, 1, 64)}, streams));
  EXPECT_NO_THROW(SparseIndexTables(Layers{swa, with(swa, 1, 0, 64)}, streams, TableSharing::none));
}

TEST(SparseIndexTables, UnknownLayerIsAnError) {
  const auto layers = model_layers(model_preset("v4-flash"), 1);
  test::RecordingStreams streams;
  SparseIndexTables tables(layers, streams);
  test::expect_smla_error([&] { tables.lookup(99, [](int) { return SparseIndexArgs{}; }); },
                          ErrorKind::value, "layer", "a layer these tables were made for", "99");
  // An id between two of the tables' layers is no layer of theirs either.
  const std::vector<LayerSpec> apart{layers[0], layers[2]};
  SparseIndexTables gap(apart, streams);
  test::expect_smla_error([&] { gap.lookup(1, [](int) { return SparseIndexArgs{}; }); },
                          ErrorKind::value, "layer", "a layer these tables were made for", "1");
}

// A table serves its key's layers as their specs say: build arguments of another ratio or window
// (they built another table under the key) or with outputs set (never written) are refused by
// name, before anything is allocated or stored.
TEST(SparseIndexTables, InputsAreTheLayersOwn) {
  const auto flash = model_layers(model_preset("v4-flash"), 1);
  LoggedStep logged({flash.begin(), flash.begin() + 3}, 1);  // SWA-only x2, then ratio 4
  // References, not a structured binding: lambdas capture them (Clang refuses bindings there).
  const test::StepCase& c = logged.c;
  SparseIndexTables& tables = logged.tables;
  SCOPED_TRACE(test::seed_note(logged.seed));
  std::vector<int32_t> out(4096);
  const auto refused = [&](int layer, auto edit, const char* argument, const char* expected,
                           const char* got) {
    const TableInputs inputs = [&](int other) {
      SparseIndexArgs a = c.args(other);
      edit(a);
      return a;
    };
    test::expect_smla_error([&] { tables.lookup(layer, inputs); }, ErrorKind::value, argument,
                            expected, got);
    EXPECT_EQ(tables.stats().bytes, 0u);
    EXPECT_TRUE(tables.stats().builds.empty());
  };
  refused(
      2, [](SparseIndexArgs& a) { a.compressed.compress_ratio = 0; }, "compress_ratio",
      "4, the layer's (its LayerSpec)", "0 (the table of layer 2, SWA group 0)");
  refused(
      0, [&](SparseIndexArgs& a) { a.compressed = c.args(2).compressed; }, "compress_ratio",
      "0, the layer's", "4 (the table of layer 0");
  refused(
      1, [](SparseIndexArgs& a) { a.window = 64; }, "window", "128, the layer's", "64");
  refused(
      1, [&](SparseIndexArgs& a) { a.out.seq_lens = make_view(out.data(), DType::i32, {}, {4}); },
      "out.seq_lens", "unset (the tables allocate their own)", "i32[4]");
  // The layer's own arguments after the refusals: its table, the one build stored.
  EXPECT_EQ(contents(tables.lookup(2, [&](int other) { return c.args(other); })), direct(c, 2));
  EXPECT_EQ(tables.stats().builds.size(), 1u);
  EXPECT_GT(tables.stats().bytes, 0u);
}

// num_tokens sizes the table's allocation: a negative count is refused by name before it (it
// came back as std::bad_alloc, or a wrapped size).
TEST(SparseIndexTables, NegativeTokenCountIsRefusedBeforeTheAllocation) {
  LoggedStep logged(model_layers(model_preset("v4-flash"), 1), 1);
  auto& [layers, seed, c, streams, tables] = logged;
  SCOPED_TRACE(test::seed_note(seed));
  const TableInputs inputs = [&c = logged.c](int layer) {
    SparseIndexArgs a = c.args(layer);
    a.step.num_tokens = -1;
    return a;
  };
  try {
    tables.lookup(layers[0].layer, inputs);
    ADD_FAILURE() << "a negative num_tokens was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::value);
    EXPECT_EQ(e.argument(), "num_tokens");
  }
  EXPECT_EQ(tables.stats().bytes, 0u);
}

// Inputs the build refuses are refused by name before they size the table's allocation: a
// num_tokens past the step's tokens (2^28: 128 GiB of table) and a DSpark width that is no
// multiple of 4 (2^31 - 1 columns) came back as std::bad_alloc.
TEST(SparseIndexTables, RefusedInputsAllocateNothing) {
  const auto layers = model_layers(model_preset("v4-flash"), 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const test::StepCase c(layers, small_step(1), seed);
  test::BoundedHostStreams streams(size_t{1} << 20);
  SparseIndexTables tables(layers, streams);
  const auto refused = [&](auto edit, const char* argument, const std::string& expected) {
    const TableInputs inputs = [&](int layer) {
      SparseIndexArgs a = c.args(layer);
      edit(a);
      return a;
    };
    test::expect_smla_error([&] { tables.lookup(layers[0].layer, inputs); }, ErrorKind::value,
                            argument, expected, "");
    EXPECT_EQ(tables.stats().bytes, 0u);
  };
  refused([](SparseIndexArgs& a) { a.step.num_tokens = int64_t{1} << 28; }, "cum_seq_lens_q",
          "cum_seq_lens_q[B] == T = 268435456");
  refused([](SparseIndexArgs& a) { a.step.decode_swa_width = INT32_MAX; }, "decode_swa_width",
          "a multiple of 4");
  EXPECT_NO_THROW(tables.lookup(layers[0].layer, [&](int layer) { return c.args(layer); }));
}

}  // namespace
}  // namespace smla
