#include "smla/tables.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/check.h"
#include "core/index_problem.h"
#include "core/layer_runs.h"

namespace smla {

std::string sparse_index_key(const LayerSpec& layer, TableSharing sharing) {
  check_layer_counts(layer, "layer.");  // as topk_width: no key for a spec no step runs
  if (sharing != TableSharing::shared && sharing != TableSharing::none)  // a cast int
    check::fail(ErrorKind::value, "sharing", "TableSharing::shared or TableSharing::none",
                std::to_string(static_cast<int>(sharing)));
  // A key no other layer has: runs of one layer, so no fork, and each new key drops the
  // group's previous table (store), keeping memory bounded as with sharing.
  if (sharing == TableSharing::none) return "layer " + std::to_string(layer.layer);
  if (layer.compress_ratio == 0) return "swa_only";
  return std::to_string(layer.kv_source) + ":" + std::to_string(layer.index_source) + ":" +
         std::to_string(layer.compress_ratio);
}

SparseIndexTables::SparseIndexTables(std::span<const LayerSpec> layers, Streams& streams,
                                     TableSharing sharing)
    : layers_(layers.begin(), layers.end()), streams_(streams) {
  int most_forks = 0;
  std::map<TableKey, size_t> first_of_key;  // the first layer each table serves
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i > 0 && layers_[i].layer <= layers_[i - 1].layer)
      check::fail(
          ErrorKind::value, "layers", "strictly increasing layer ids",
          std::to_string(layers_[i - 1].layer) + " then " + std::to_string(layers_[i].layer));
    check_layer_counts(layers_[i], "layers[" + std::to_string(i) + "].");
    keys_.push_back(sparse_index_key(layers_[i], sharing));
    // SPEC §5's key leaves the window out, which sets a table's width and SWA columns: a layer
    // of another window would read its key's table as if it were its own.
    const TableKey key{layers_[i].swa_group, keys_[i]};
    const size_t first = first_of_key.try_emplace(key, i).first->second;
    if (layers_[first].window != layers_[i].window)
      check::fail(ErrorKind::value, "layers[" + std::to_string(i) + "].window",
                  "layers[" + std::to_string(first) + "]'s window " +
                      std::to_string(layers_[first].window) + " (SWA group " +
                      std::to_string(key.first) + ", key " + key.second +
                      ": one table serves both)",
                  "window " + std::to_string(layers_[i].window));
  }
  run_end_.resize(layers_.size());
  for (const LayerRun& run : layer_runs(layers_, sharing)) {
    std::fill(run_end_.begin() + run.first, run_end_.begin() + run.end, run.end);
    // A fork builds at most one table per group other than the leader's.
    most_forks = std::max(most_forks, static_cast<int>(run.layers_in_group.size()) - 1);
  }
  streams_.reserve_events(most_forks);
}

size_t SparseIndexTables::position(int layer) const {
  return layer_position(layers_, layer, "a layer these tables were made for");
}

SparseIndexTable SparseIndexTables::lookup(int layer, const TableInputs& inputs,
                                           const TableArgumentNames& names) {
  const size_t i = position(layer);
  const TableKey key{layers_[i].swa_group, keys_[i]};
  if (const auto hit = tables_.find(key); hit != tables_.end()) {
    if (const auto event = pending_.find(key); event != pending_.end()) {
      streams_.wait(event->second);
      stats_.waits.push_back(layer);
    }
    return hit->second.table;
  }
  const SparseIndexTable table = build(layer, inputs, names, key, streams_.current());
  fork(i, inputs, names);
  return table;
}

std::shared_ptr<void> SparseIndexTables::memory(int layer) const {
  const size_t i = position(layer);
  const auto stored = tables_.find({layers_[i].swa_group, keys_[i]});
  return stored == tables_.end() ? nullptr : stored->second.memory;
}

SparseIndexTable SparseIndexTables::build(int layer, const TableInputs& inputs,
                                          const TableArgumentNames& names, const TableKey& key,
                                          void* stream) {
  try {
    SparseIndexArgs args = inputs(layer);
    // The table serves the layers of its key as their specs say: arguments of another ratio or
    // window would build another table under that key, and outputs given would go unwritten.
    const LayerSpec& spec = layers_[position(layer)];
    if (args.compressed.compress_ratio != spec.compress_ratio)
      check::fail(ErrorKind::value, "compress_ratio",
                  std::to_string(spec.compress_ratio) + ", the layer's (its LayerSpec)",
                  std::to_string(args.compressed.compress_ratio));
    if (args.window != spec.window)
      check::fail(ErrorKind::value, "window",
                  std::to_string(spec.window) + ", the layer's (its LayerSpec)",
                  std::to_string(args.window));
    for (const auto& [view, name] : {std::pair{&args.out.sparse_indices, "out.sparse_indices"},
                                     std::pair{&args.out.sparse_topk_lens, "out.sparse_topk_lens"},
                                     std::pair{&args.out.seq_lens, "out.seq_lens"}})
      if (view->defined())
        check::fail(ErrorKind::value, name, "unset (the tables allocate their own)",
                    describe(*view));
    // Checked before the allocation they size: a step the build refuses (a num_tokens past its
    // requests', a DSpark width it cannot have) must be refused by name, not by std::bad_alloc.
    validate_index_inputs(args, streams_.device());
    const int64_t T = args.step.num_tokens, K = sparse_index_columns(args);
    const bool dspark = args.step.decode_swa_width > args.window;
    // One allocation: indices, lengths, and (DSpark) the per-token seq_lens.
    const size_t bytes = sizeof(int32_t) * static_cast<size_t>(T * K + T + (dspark ? T : 0));
    Stored stored{.memory = streams_.allocate(bytes), .bytes = bytes};
    int32_t* base = static_cast<int32_t*>(stored.memory.get());
    const Device device = streams_.device();
    SparseIndexTable& out = stored.table;
    out.sparse_indices = make_view(base, DType::i32, device, {T, K});
    out.sparse_topk_lens = make_view(base + T * K, DType::i32, device, {T});
    if (dspark) out.seq_lens = make_view(base + T * K + T, DType::i32, device, {T});
    args.out = out;
    build_sparse_indices(args, stream);
    store(key, std::move(stored));
    ++stats_.builds[key];
    return out;
  } catch (const Error& e) {  // a forked build fails in another layer's lookup: say which
    throw check::renamed(
        e, [&](const std::string& name) { return names ? names(layer, name) : std::string(); },
        " (the table of layer " + std::to_string(layer) + ", SWA group " +
            std::to_string(key.first) + ")");
  }
}

void SparseIndexTables::store(const TableKey& key, Stored stored) {
  const auto& [group, name] = key;
  // Runs of a key are consecutive, so a new key ends the group's previous compressed one (SPEC
  // §5: it is dropped; the swa_only table stays).
  for (auto it = tables_.begin(); it != tables_.end();) {
    const bool stale =
        it->first.first == group && it->first.second != "swa_only" && it->first.second != name;
    if (!stale) {
      ++it;
      continue;
    }
    stats_.bytes -= it->second.bytes;
    // A forked build nobody looked up may still be writing the block: the current stream,
    // on which the block is next handed out, waits for it first.
    if (const auto event = pending_.find(it->first); event != pending_.end()) {
      streams_.wait(event->second);
      pending_.erase(event);
    }
    it = tables_.erase(it);
  }
  stats_.bytes += stored.bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes);
  tables_[key] = std::move(stored);
  int held = 0;
  for (const auto& entry : tables_) held += entry.first.first == group;
  stats_.peak_tables[group] = std::max(stats_.peak_tables[group], held);
}

void SparseIndexTables::fork(size_t leader, const TableInputs& inputs,
                             const TableArgumentNames& names) {
  const std::string& name = keys_[leader];
  std::vector<size_t> builds;  // the first follower of each other group lacking the table
  std::set<int> seen{layers_[leader].swa_group};
  for (size_t f = leader + 1; f < run_end_[leader]; ++f) {
    const int group = layers_[f].swa_group;
    if (seen.insert(group).second && !tables_.contains({group, name})) builds.push_back(f);
  }
  if (builds.empty()) return;
  streams_.fork();
  forked_ = true;
  try {
    for (size_t n = 0; n < builds.size(); ++n) {
      const TableKey key{layers_[builds[n]].swa_group, name};
      build(layers_[builds[n]].layer, inputs, names, key, streams_.side());
      // Slots are reused across forks: a wait on a re-recorded slot waits for more work on
      // the same in-order side stream, never less.
      streams_.record(static_cast<int>(n));
      pending_[key] = static_cast<int>(n);
      stats_.forks.push_back(key);
    }
  } catch (...) {
    // Joined so that a capture reports this error, not unjoined side-stream work; a join that
    // fails too (an invalidated capture) must not replace the error that caused it.
    try {
      join();
    } catch (...) {
    }
    throw;
  }
}

SparseIndexTables::~SparseIndexTables() {
  try {  // blocks go back to the streams' cache: no side-stream build may still write them
    join();
  } catch (...) {
  }
}

void SparseIndexTables::join() {
  if (!forked_) return;
  forked_ = false;  // first: a join that throws still leaves the tables unforked
  pending_.clear();
  streams_.join();
}

void SparseIndexTables::reset() {
  join();
  tables_.clear();
  pending_.clear();
  stats_ = {};
}

}  // namespace smla
