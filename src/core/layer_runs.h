// The layers of a step as the tables and the executor walk them: found by id, and cut into runs
// (stretches of consecutive layers with equal sparse_index_key); a spec's counts checked.
#pragma once
#include <algorithm>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "smla/tables.h"

namespace smla {

// A negative ratio would run as an SWA-only layer and a negative top-k as every compressed
// entry, and a window below 1 would fail only when a step runs: refused, each named `prefix` +
// field.
inline void check_layer_counts(const LayerSpec& spec, const std::string& prefix) {
  if (spec.window < 1)
    check::fail(ErrorKind::value, prefix + "window", ">= 1", std::to_string(spec.window));
  if (spec.compress_ratio < 0)
    check::fail(ErrorKind::value, prefix + "compress_ratio", ">= 0 (0: SWA-only)",
                std::to_string(spec.compress_ratio));
  if (spec.index_topk < 0)
    check::fail(ErrorKind::value, prefix + "index_topk", ">= 0 (0: every compressed entry)",
                std::to_string(spec.index_topk));
}

// The index of layer id `layer` in `layers` (ids strictly increasing); else a value error
// naming "layer", `expected` saying what it should have been.
inline size_t layer_position(std::span<const LayerSpec> layers, int layer,
                             const char* expected) {
  const auto it = std::lower_bound(layers.begin(), layers.end(), layer,
                                   [](const LayerSpec& s, int id) { return s.layer < id; });
  if (it == layers.end() || it->layer != layer)
    check::fail(ErrorKind::value, "layer", expected, std::to_string(layer));
  return static_cast<size_t>(it - layers.begin());
}

struct LayerRun {
  size_t first, end;                   // layers [first, end)
  std::map<int, int> layers_in_group;  // SWA group -> its layers in the run
};

inline std::vector<LayerRun> layer_runs(std::span<const LayerSpec> layers, TableSharing sharing) {
  std::vector<LayerRun> runs;
  for (size_t first = 0, end = 0; first < layers.size(); first = end) {
    LayerRun run{first, first, {}};
    const std::string key = sparse_index_key(layers[first], sharing);
    for (end = first; end < layers.size() && sparse_index_key(layers[end], sharing) == key; ++end)
      ++run.layers_in_group[layers[end].swa_group];
    run.end = end;
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace smla
