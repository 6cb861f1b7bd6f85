#include "smla/executor.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/layer_runs.h"
#include "core/problem.h"

namespace smla {
namespace {

std::vector<LayerSpec> specs_of(const std::vector<AttentionLayer>& layers) {
  std::vector<LayerSpec> specs;
  for (const AttentionLayer& l : layers) specs.push_back(l.spec);
  return specs;
}

// A zeroed u8 buffer of `bytes` on the streams' device; absent when nothing is needed.
// `persistent`: state kept across launches (counters), in memory no graph was captured with.
TensorView zeroed(Streams& streams, size_t bytes, std::shared_ptr<void>& owner, bool persistent) {
  if (bytes == 0) return {};
  owner = persistent ? streams.allocate_persistent(bytes) : streams.allocate(bytes);
  streams.zero(owner.get(), bytes);
  return make_view(owner.get(), DType::u8, streams.device(), {static_cast<int64_t>(bytes)});
}

// Workspace for every decode launch of the step: up to max_tokens tokens and max_columns
// columns (workspace_bytes covers both), any layer's heads.
size_t step_workspace_bytes(const std::vector<AttentionLayer>& layers, int64_t max_tokens,
                            int64_t max_columns, Device device) {
  std::set<int> heads;
  for (const AttentionLayer& l : layers) heads.insert(l.spec.num_heads);
  size_t most = 0;
  for (int h : heads) most = std::max(most, workspace_bytes(max_tokens, h, max_columns, device));
  return most;
}

template <class Map>
TensorView entry(const Map& map, int layer, const char* name, const char* role) {
  const auto it = map.find(layer);
  if (it == map.end())
    check::fail(ErrorKind::value, name,
                std::string("an entry for ") + role + " layer " + std::to_string(layer), "none");
  return it->second;
}

// A compressed layer's columns in this step: its index source's top-k, its kv source's pages.
CompressedColumns compressed_columns(const StepInputs& inputs, const AttentionLayer& l) {
  return {.compress_ratio = l.spec.compress_ratio,
          .topk_indices =
              entry(inputs.topk_indices, l.spec.index_source, "topk_indices", "index source"),
          .block_table = entry(inputs.compressed_block_tables, l.spec.kv_source,
                               "compressed_block_tables", "kv source"),
          .compressed_kv_cache = l.compressed_kv_cache};
}

// The StepInputs field, keyed as the caller keyed it, behind the name that a table build
// (SparseIndexArgs') or a decode (DecodeArgs' topk_columns) of layer `l` gives an argument, in
// its error's argument or texts; "" for the others, named as the caller's already (the
// metadata's fields, the query) or the layer's own (its pools, scales and spec). The tables and
// decodes of every layer name these alike, whichever entry they read.
std::string step_input_name(const AttentionLayer& l, const std::string& argument) {
  const auto keyed = [](const char* field, int key) {
    return std::string(field) + "[" + std::to_string(key) + "]";
  };
  if (argument == "block_table") return keyed("block_tables", l.spec.swa_group);
  if (argument == "topk_indices" || argument == "topk_columns.topk_indices")
    return keyed("topk_indices", l.spec.index_source);
  if (argument == "compressed.block_table" || argument == "topk_columns.block_table")
    return keyed("compressed_block_tables", l.spec.kv_source);
  if (argument == "topk_columns.is_valid_token") return "is_valid_token";  // the metadata's
  if (argument == "topk_columns.num_decodes") return "num_decodes";
  return "";
}

// A layer's spec and scales, named by its position in the list. A negative group would be
// looked up as a huge one: refused here.
void check_layer(const AttentionLayer& l, size_t i) {
  const std::string layer = "layers[" + std::to_string(i) + "].";
  if (const int heads = l.spec.num_heads; heads < 1 || heads > kMaxHeads)
    check::fail(heads < 1 ? ErrorKind::value : ErrorKind::unsupported, layer + "spec.num_heads",
                "1.." + std::to_string(kMaxHeads), std::to_string(heads));
  check_layer_counts(l.spec, layer + "spec.");
  if (l.spec.swa_group < 0)
    check::fail(ErrorKind::value, layer + "spec.swa_group", ">= 0",
                std::to_string(l.spec.swa_group));
  // A step's compressed block tables and top-k are looked up by these: unset (-1), the first
  // step would fail, naming an entry for layer -1.
  for (const auto& [source, name] :
       {std::pair{l.spec.kv_source, "kv_source"}, std::pair{l.spec.index_source, "index_source"}})
    if (l.spec.compress_ratio > 0 && source < 0)
      check::fail(ErrorKind::value, layer + "spec." + name,
                  "a layer id >= 0 for a compressed layer (compress_ratio " +
                      std::to_string(l.spec.compress_ratio) + ")",
                  std::to_string(source));
  // Absent, the decode would read the SWA pool through the compressed block table.
  if (l.spec.compress_ratio > 0 && !l.compressed_kv_cache.defined())
    check::fail(
        ErrorKind::value, layer + "compressed_kv_cache",
        "its kv source's pool (compress_ratio " + std::to_string(l.spec.compress_ratio) + ")",
        "absent");
  check::scales(l.bmm1_scale, l.bmm2_scale, layer);
}

// What a table assumes of every layer that reads it, which SPEC §5's key leaves out: one window
// and one page geometry of the pools whose rows its offsets count (page * span + slot).
// `tables`: the specs the tables see (table_specs); `pools`: each layer's SWA and compressed
// pool geometry, 2 a layer.
void check_shared_geometry(const std::vector<AttentionLayer>& layers,
                           const std::vector<LayerSpec>& tables, std::span<const KvPool> pools,
                           TableSharing sharing) {
  // (table, what) -> the first layer's index and value
  std::map<std::pair<std::string, std::string>, std::pair<size_t, std::string>> seen;
  const auto same = [&](const std::string& table, const char* what, const std::string& name,
                        const std::string& value, size_t i) {
    const auto [it, fresh] = seen.try_emplace({table, what}, i, value);
    if (!fresh && it->second.second != value)
      check::fail(ErrorKind::value, name,
                  "layers[" + std::to_string(it->second.first) + "]'s " + it->second.second + " (" +
                      table + ": one table serves both)",
                  value);
  };
  const auto pages = [](const KvPool& p) {
    return "block_size " + std::to_string(p.block_size) + ", page span " + std::to_string(p.span);
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& s = tables[i];
    const std::string layer = "layers[" + std::to_string(i) + "].";
    const std::string table =
        "SWA group " + std::to_string(s.swa_group) + ", key " + sparse_index_key(s, sharing);
    same(table, "window", layer + "spec.window", "window " + std::to_string(s.window), i);
    same(table, "SWA pages", layer + "swa_kv_cache", pages(pools[2 * i]), i);
    if (s.compress_ratio > 0)
      same(table, "compressed pages", layer + "compressed_kv_cache", pages(pools[2 * i + 1]), i);
  }
}

// What a step reads besides its queries: every layer's pools (an fp8_ds_mla pool's records and
// scale footers too: `pool_records`, two a layer) and sinks, and the step's inputs, which
// tables (and their forks) read.
std::vector<check::NamedView> step_reads(std::span<const AttentionLayer> layers,
                                         std::span<const TensorView> pool_records,
                                         const StepInputs& inputs) {
  std::vector<check::NamedView> read;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto at = static_cast<int64_t>(i);
    read.push_back({&layers[i].swa_kv_cache, "layers", at, ".swa_kv_cache"});
    if (layers[i].spec.compress_ratio > 0)  // an SWA-only layer's is never read (nor checked)
      read.push_back({&layers[i].compressed_kv_cache, "layers", at, ".compressed_kv_cache"});
    read.push_back({&layers[i].sinks, "layers", at, ".sinks"});
    read.push_back({&pool_records[2 * i], "layers", at, ".swa_kv_cache's records"});
    read.push_back({&pool_records[2 * i + 1], "layers", at, ".compressed_kv_cache's records"});
  }
  const StepMetadata& m = inputs.metadata;
  read.push_back({&m.seq_lens, "seq_lens"});  // the metadata's fields, as every error names them
  read.push_back({&m.cum_seq_lens_q, "cum_seq_lens_q"});
  read.push_back({&m.is_valid_token, "is_valid_token"});
  for (size_t g = 0; g < inputs.block_tables.size(); ++g)
    read.push_back({&inputs.block_tables[g], "block_tables", static_cast<int64_t>(g)});
  for (const auto& [layer, table] : inputs.compressed_block_tables)
    read.push_back({&table, "compressed_block_tables", layer});
  for (const auto& [layer, topk] : inputs.topk_indices)
    read.push_back({&topk, "topk_indices", layer});
  return read;
}

}  // namespace

// Each decode checks its own layer's arguments; across layers, an out over another layer's
// query, out or pools, or over the step's inputs, would change what a later layer reads.
void StepExecutor::check_step_apart(const StepInputs& inputs, std::span<const TensorView> queries,
                                    std::span<const TensorView> outs) const {
  std::vector<check::NamedView> written, read = step_reads(layers_, pool_records_, inputs);
  for (size_t i = 0; i < outs.size(); ++i) {
    written.push_back({&outs[i], "outs", static_cast<int64_t>(i)});
    read.push_back({&queries[i], "queries", static_cast<int64_t>(i)});
  }
  check::views(written);
  check::views(read);
  check::all_apart(written, read);
}

const char* compressed_index_name(CompressedIndex compressed_index) {
  switch (compressed_index) {
    case CompressedIndex::table: return "table";
    case CompressedIndex::topk: return "topk";
    case CompressedIndex::automatic: return "auto";
  }
  return "?";
}

int64_t every_entry_topk_width(std::span<const LayerSpec> layers, const StepInputs& inputs) {
  int64_t widest = 0;
  for (const LayerSpec& s : layers)
    if (s.compress_ratio > 0 && s.index_topk == 0)
      if (const auto it = inputs.topk_indices.find(s.index_source); it != inputs.topk_indices.end())
        widest = std::max(widest, it->second.size(1));
  return widest;
}

std::vector<LayerSpec> table_specs(std::span<const LayerSpec> layers,
                                   CompressedIndex compressed_index, TableSharing sharing,
                                   int64_t every_entry_width, Device device) {
  if (static_cast<unsigned>(compressed_index) > static_cast<unsigned>(CompressedIndex::automatic))
    check::fail(ErrorKind::value, "compressed_index", "table, topk or auto",
                std::to_string(static_cast<int>(compressed_index)));
  std::vector<LayerSpec> specs(layers.begin(), layers.end());
  if (compressed_index == CompressedIndex::table) return specs;
  const int64_t readable = max_topk_width(device);
  const auto width = [every_entry_width](const LayerSpec& s) -> int64_t {
    if (s.compress_ratio == 0) return 0;
    return s.index_topk > 0 ? s.index_topk : every_entry_width;
  };
  // A run is a stretch of consecutive equal keys; its table in a group serves the run's layers
  // of that group (SparseIndexTables::store drops it at the group's next key). A run reads its
  // columns one way: tables in some groups and the top-k in others measured slower than either
  // (docs/sparse_index.md).
  for (const LayerRun& run : layer_runs(layers, sharing)) {
    const auto end = layers.begin() + static_cast<ptrdiff_t>(run.end);
    const auto wide = std::find_if(layers.begin() + static_cast<ptrdiff_t>(run.first), end,
                                   [&](const LayerSpec& s) { return width(s) > readable; });
    if (wide != end && compressed_index == CompressedIndex::topk)
      check::fail(ErrorKind::unsupported, "compressed_index",
                  "top-k widths up to " + std::to_string(readable) + " (what the decode reads on " +
                      device_name(device) + ") for compressed_index \"topk\"; \"table\" or " +
                      "\"auto\" build tables for wider ones",
                  "layers[" + std::to_string(wide - layers.begin()) + "] (layer " +
                      std::to_string(wide->layer) + ") reading up to " +
                      std::to_string(width(*wide)) + " columns");
    const bool unshared =
        std::ranges::any_of(run.layers_in_group, [](auto g) { return g.second == 1; });
    if (wide == end && (compressed_index == CompressedIndex::topk || unshared))
      for (size_t i = run.first; i < run.end; ++i) specs[i].compress_ratio = 0;
  }
  return specs;
}

StepExecutor::StepExecutor(std::vector<AttentionLayer> layers, Streams& streams, int64_t max_tokens,
                           int64_t max_columns, TableSharing sharing,
                           CompressedIndex compressed_index)
    : layers_(std::move(layers)),
      specs_(specs_of(layers_)),
      streams_(streams),
      compressed_index_(compressed_index) {
  // As workspace_bytes checks them, but whatever the layers: it runs once per head count, so an
  // executor without layers would take any sizes.
  check::int32_count(max_tokens, "max_tokens");
  check::int32_count(max_columns, "max_columns");
  std::vector<KvPool> pools;  // each layer's SWA and compressed pool geometry, made once
  const Device device = streams.device();
  const auto add_pool = [&](const TensorView& view, const std::string& name) {
    pools.push_back(make_pool(view, name.c_str()));
    if (!(view.device == device))
      check::fail(ErrorKind::type, name, device_name(device) + " (the streams' device)",
                  device_name(view.device));
    pool_records_.push_back(pool_records(view, pools.back()));
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const AttentionLayer& l = layers_[i];
    check_layer(l, i);  // a compressed layer has its compressed pool
    const std::string layer = "layers[" + std::to_string(i) + "].";
    add_pool(l.swa_kv_cache, layer + "swa_kv_cache");
    if (l.spec.compress_ratio > 0) {
      add_pool(l.compressed_kv_cache, layer + "compressed_kv_cache");
      // The decode reads both pools in one layout: refused here, not as the layer runs, after
      // the layers before it have written their outs.
      if (l.compressed_kv_cache.dtype != l.swa_kv_cache.dtype)
        check::fail(ErrorKind::type, layer + "compressed_kv_cache",
                    std::string(dtype_name(l.swa_kv_cache.dtype)) + " (the layout of " + layer +
                        "swa_kv_cache)",
                    dtype_name(l.compressed_kv_cache.dtype));
    } else {  // an SWA-only layer's compressed pool is never read: not checked
      pools.emplace_back();
      pool_records_.emplace_back();
    }
    // As its decode checks them, but before any layer of a step has run.
    check::sinks(l.sinks, layer + "sinks", l.spec.num_heads, device);
  }
  // The plan of steps whose top-k all fit the decode, and in automatic mode the one of steps
  // where the layers reading every entry have a wider one, where it differs.
  const auto same = [](const std::vector<LayerSpec>& a, const std::vector<LayerSpec>& b) {
    return std::ranges::equal(a, b, {}, &LayerSpec::compress_ratio, &LayerSpec::compress_ratio);
  };
  for (int64_t every_entry_width : {int64_t{0}, INT64_MAX}) {
    if (every_entry_width > 0 && compressed_index != CompressedIndex::automatic) break;
    std::vector<LayerSpec> specs =
        table_specs(specs_, compressed_index, sharing, every_entry_width, streams.device());
    if (!plans_.empty() && same(specs, plans_[0].specs)) break;
    check_shared_geometry(layers_, specs, pools, sharing);
    auto tables = std::make_unique<SparseIndexTables>(specs, streams_, sharing);
    plans_.push_back({std::move(specs), std::move(tables)});
  }
  int max_heads = 1;
  for (const AttentionLayer& l : layers_) max_heads = std::max(max_heads, l.spec.num_heads);
  const bool gpu = streams_.device().kind != DeviceKind::cpu;  // the CPU needs no counters
  counters_view_ =
      zeroed(streams_, gpu ? kv_counter_bytes(max_tokens, max_heads) : 0, counters_, true);
  workspace_view_ =
      zeroed(streams_, step_workspace_bytes(layers_, max_tokens, max_columns, streams_.device()),
             workspace_, false);
}

StepExecutor::~StepExecutor() = default;

size_t StepExecutor::position(int layer) const {
  return layer_position(specs_, layer, "a layer of this executor");
}

bool StepExecutor::reads_topk(int layer) const {
  const size_t i = position(layer);
  return specs_[i].compress_ratio > 0 && table_specs_now()[i].compress_ratio == 0;
}

SparseIndexArgs StepExecutor::table_inputs(int layer) const {
  const AttentionLayer& l = layer_at(layer);
  SparseIndexArgs args;
  args.step = inputs_.metadata;
  args.window = l.spec.window;
  const size_t group = static_cast<size_t>(l.spec.swa_group);
  if (group >= inputs_.block_tables.size())
    check::fail(ErrorKind::value, "block_tables",
                "a block table for SWA group " + std::to_string(group),
                std::to_string(inputs_.block_tables.size()) + " block tables");
  args.swa = {inputs_.block_tables[group], l.swa_kv_cache};
  if (table_specs_now()[position(layer)].compress_ratio > 0)
    args.compressed = compressed_columns(inputs_, l);
  return args;
}

void StepExecutor::begin_step(const StepInputs& inputs) {
  begun_ = false;  // a refused step leaves no earlier step's inputs for run_layer
  size_t plan = 0;
  try {
    plan = checked_plan(inputs);
  } catch (...) {
    join_after_error();  // the open step ends joined: a capture of it can still end
    throw;
  }
  for (Plan& p : plans_) p.tables->reset();
  plan_ = plan;
  inputs_ = inputs;
  step_reads_.reset();  // its views are the previous step's
  next_position_ = 0;
  begun_ = true;
  ++steps_begun_;
}

size_t StepExecutor::checked_plan(const StepInputs& inputs) const {
  const int64_t readable = max_topk_width(streams_.device());
  const size_t plan = every_entry_topk_width(specs_, inputs) > readable ? plans_.size() - 1 : 0;
  // A top-k the plan has the decode read but it cannot (topk mode, or an index source's wider
  // than its index_topk): refused before any launch, naming the layer.
  for (size_t i = 0; i < specs_.size(); ++i) {
    const LayerSpec& s = specs_[i];
    const auto topk = inputs.topk_indices.find(s.index_source);
    if (s.compress_ratio == 0 || plans_[plan].specs[i].compress_ratio > 0 ||
        topk == inputs.topk_indices.end() || topk->second.size(1) <= readable)
      continue;
    check::fail(ErrorKind::unsupported, "topk_indices[" + std::to_string(s.index_source) + "]",
                "top-k widths up to " + std::to_string(readable) +
                    " where the decode reads them (" + device_name(streams_.device()) +
                    ", compressed_index \"" + compressed_index_name(compressed_index_) + "\")",
                std::to_string(topk->second.size(1)) + " columns for layers[" + std::to_string(i) +
                    "] (layer " + std::to_string(s.layer) + ")");
  }
  // The decodes read these contiguous (the table builders take any stride): refused here, before
  // any table is built, rather than at the first decode, by the names the caller gave them.
  const auto contiguous = [](const TensorView& view, const std::string& name) {
    if (!view.defined()) return;
    check::view(view, name);
    check::memory(view, name);
  };
  contiguous(inputs.metadata.seq_lens, "seq_lens");
  contiguous(inputs.metadata.cum_seq_lens_q, "cum_seq_lens_q");
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].compress_ratio == 0) continue;
    // Every compressed layer's entries, here: a table build's lookup would name a missing top-k
    // as the entry it lacks (topk_indices[S]).
    const CompressedColumns c = compressed_columns(inputs, layers_[i]);
    if (plans_[plan].specs[i].compress_ratio > 0) continue;  // not read by its decode
    contiguous(c.topk_indices, "topk_indices[" + std::to_string(specs_[i].index_source) + "]");
    contiguous(c.block_table,
               "compressed_block_tables[" + std::to_string(specs_[i].kv_source) + "]");
  }
  return plan;
}

bool StepExecutor::is_index_source(size_t i) const {
  const LayerSpec& spec = table_specs_now()[i];  // what its table reads
  return spec.compress_ratio > 0 && spec.index_topk > 0 && spec.index_source == spec.layer;
}

SparseIndexTable StepExecutor::table_of(const AttentionLayer& l) {
  if (is_index_source(position(l.spec.layer))) tables_now().join();
  return tables_now().lookup(
      l.spec.layer, [this](int other) { return table_inputs(other); },
      [this](int other, const std::string& argument) {
        return step_input_name(layer_at(other), argument);
      });
}

void StepExecutor::before_next(size_t i) {
  if (i + 1 < layers_.size() && is_index_source(i + 1)) tables_now().join();
}

void StepExecutor::run_layer(int layer, const TensorView& query, const TensorView& out) {
  if (!begun_)  // else the empty inputs' first lookup would blame a block table
    check::fail(ErrorKind::value, "run_layer", "a step begun by begin_step(inputs) first",
                "no step begun");
  size_t i = 0;
  try {
    i = next_position(layer);
    // The decode checks out against what it reads; the forks of its lookup read other groups'
    // inputs while it writes, and later layers the rest. (run_step checks all outs at once.)
    if (!step_reads_)
      step_reads_ =
          std::make_unique<const check::ReadViews>(step_reads(layers_, pool_records_, inputs_));
    step_reads_->apart_from(out, "out");
  } catch (const Error& e) {
    join_after_error();  // an earlier layer may have forked: a capture must still end joined
    if (e.argument() != "out") throw;
    throw Error(e.kind(), e.argument(), e.expected(),
                e.got() + " (layer " + std::to_string(layer) + ")");
  } catch (...) {
    join_after_error();
    throw;
  }
  run_at(i, query, out);
}

size_t StepExecutor::next_position(int layer) const {
  const size_t i = position(layer);
  // An earlier layer may read a top-k that a later index source's indexer has overwritten since.
  if (i < next_position_)
    check::fail(ErrorKind::value, "layer",
                "a layer after layer " + std::to_string(layers_[next_position_ - 1].spec.layer) +
                    " (layers run in model order, each once a step)",
                "layer " + std::to_string(layer));
  return i;
}

void StepExecutor::run_at(size_t i, const TensorView& query, const TensorView& out) {
  try {
    decode(layers_[i], query, out);
  } catch (...) {
    join_after_error();  // the lookup may have forked: a capture must still end joined
    throw;
  }
  next_position_ = i + 1;
  before_next(i);
}

void StepExecutor::join_after_error() noexcept {
  try {
    tables_now().join();
  } catch (...) {  // the caller's error is the one to report
  }
}

void StepExecutor::decode(const AttentionLayer& l, const TensorView& query, const TensorView& out) {
  const int layer = l.spec.layer;
  const StepMetadata& step = inputs_.metadata;
  // The query's tokens and heads are the step's and the layer's (a decode would blame its table,
  // and the shared buffers are sized for spec.num_heads); other shape errors are the decode's.
  if (query.defined() && query.ndim == 3 &&
      (query.size(0) != step.num_tokens || query.size(1) != l.spec.num_heads))
    check::fail(ErrorKind::value, "query",
                "[T = num_tokens = " + std::to_string(step.num_tokens) +
                    ", H = num_heads = " + std::to_string(l.spec.num_heads) + ", 512]",
                check::shape_of(query) + " (layer " + std::to_string(layer) + ")");
  const SparseIndexTable table = table_of(l);

  DecodeArgs args;
  args.query = query;
  args.out = out;
  args.swa_kv_cache = l.swa_kv_cache;
  // SWA-only layers leave it absent: columns past W (DSpark) then read the SWA pool.
  if (l.spec.compress_ratio > 0) args.compressed_kv_cache = l.compressed_kv_cache;
  args.sparse_indices = table.sparse_indices;
  if (reads_topk(layer)) {
    if (step.decode_swa_width > l.spec.window)
      check::fail(ErrorKind::value, "compress_ratio",
                  "0 (the DSpark window is for SWA-only layers)",
                  std::to_string(l.spec.compress_ratio) + " (layer " + std::to_string(layer) + ")");
    const CompressedColumns c = compressed_columns(inputs_, l);
    args.topk_columns = {.topk_indices = c.topk_indices,
                         .block_table = c.block_table,
                         .is_valid_token = step.is_valid_token,
                         .num_decodes = step.num_decodes,
                         .compress_ratio = l.spec.compress_ratio};
  } else {
    args.sparse_topk_lens = table.sparse_topk_lens;
  }
  if (table.seq_lens.defined()) {  // DSpark: one request per token
    args.seq_lens = table.seq_lens;
    args.max_q_len = 1;
  } else {
    args.seq_lens = step.seq_lens;
    args.cum_seq_lens_q = step.cum_seq_lens_q;
    args.max_q_len = step.max_q_len;
  }
  args.sinks = l.sinks;
  args.bmm1_scale = l.bmm1_scale;
  args.bmm2_scale = l.bmm2_scale;
  args.workspace = workspace_view_;
  args.kv_counters = counters_view_;
  args.window = l.spec.window;
  try {
    sparse_mla_decode(args, streams_.current());
  } catch (const Error& e) {  // every layer's arguments have the same names: say which
    throw check::renamed(
        e, [&l](const std::string& name) { return step_input_name(l, name); },
        " (layer " + std::to_string(layer) + ")");
  }
}

void StepExecutor::end_step() {
  begun_ = false;
  tables_now().join();
}

void StepExecutor::each_layer(const StepInputs& inputs,
                              const std::function<void(size_t)>& layer_work) {
  begin_step(inputs);
  try {
    for (size_t i = 0; i < layers_.size(); ++i) layer_work(i);
  } catch (...) {
    begun_ = false;
    join_after_error();  // a failed step still ends joined
    throw;
  }
  end_step();
}

void StepExecutor::run_step(const StepInputs& inputs, std::span<const TensorView> queries,
                            std::span<const TensorView> outs) {
  if (queries.size() != layers_.size() || outs.size() != layers_.size())
    check::fail(
        ErrorKind::value, "queries",
        "one query and one out per layer (" + std::to_string(layers_.size()) + ")",
        std::to_string(queries.size()) + " queries, " + std::to_string(outs.size()) + " outs");
  check_step_apart(inputs, queries, outs);
  each_layer(inputs, [&](size_t i) { run_at(i, queries[i], outs[i]); });
}

void StepExecutor::build_tables(const StepInputs& inputs) {
  each_layer(inputs, [this](size_t i) {
    table_of(layers_[i]);
    before_next(i);
  });
}

}  // namespace smla
