#include "smla/model.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/layer_runs.h"

namespace smla {
namespace {

// SPEC §6 writes ratios as sums of repeated lists: [0,0]+[4,128]*20+[4,0].
struct Repeat {
  std::vector<int> values;
  int times = 1;
};
std::vector<int> ratios(std::initializer_list<Repeat> parts) {
  std::vector<int> all;
  for (const Repeat& part : parts)
    for (int i = 0; i < part.times; ++i)
      all.insert(all.end(), part.values.begin(), part.values.end());
  return all;
}

const std::vector<ModelPreset>& presets() {
  static const std::vector<ModelPreset> all = {
      {.name = "v4-flash",
       .num_layers = 43,
       .num_mtp_layers = 1,
       .num_heads = 64,
       .index_topk = 512,
       .compress_ratios = ratios({{{0, 0}}, {{4, 128}, 20}, {{4, 0}}}),
       .every_entry_ratio = 128},
      {.name = "v4-pro",
       .num_layers = 61,
       .num_mtp_layers = 1,
       .num_heads = 128,
       .index_topk = 1024,
       .compress_ratios = ratios({{{128, 128}}, {{4, 128}, 29}, {{4, 0}}}),
       .every_entry_ratio = 128},
      {.name = "v41-flash",
       .num_layers = 40,
       .num_mtp_layers = 3,
       .num_heads = 64,
       .index_topk = 512,
       .compress_ratios = ratios({{{0, 0}}, {{2}, 18}, {{1}, 20}, {{0, 0, 0}}}),
       .kv_sources = {2, 8, 14, 20},
       .index_sources = {2, 8, 14, 20, 24, 28, 32, 36}},
  };
  return all;
}

// The latest of `sources` at or below `layer`; `layer` itself when there are none listed.
int source_of(const std::vector<int>& sources, int layer, const char* what) {
  if (sources.empty()) return layer;
  int found = -1;
  for (int s : sources)
    if (s <= layer) found = std::max(found, s);
  if (found < 0)
    check::fail(ErrorKind::value, what, "a source layer at or below layer " + std::to_string(layer),
                "none");
  return found;
}

}  // namespace

int64_t topk_width(const LayerSpec& layer, int64_t max_seq_len) {
  // A negative length would give a negative width, which no top-k has.
  if (max_seq_len < 0)
    check::fail(ErrorKind::value, "max_seq_len", ">= 0", std::to_string(max_seq_len));
  check_layer_counts(layer, "layer.");
  if (layer.compress_ratio == 0) return 0;
  return layer.index_topk > 0 ? layer.index_topk : max_seq_len / layer.compress_ratio;
}

std::span<const ModelPreset> model_presets() { return presets(); }

const ModelPreset& model_preset(std::string_view name) {
  std::string names;
  for (const ModelPreset& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  check::fail(ErrorKind::value, "name", "one of " + names, std::string(name));
}

std::vector<LayerSpec> model_layers(const ModelPreset& preset, int num_swa_groups, bool with_mtp) {
  if (num_swa_groups < 1)
    check::fail(ErrorKind::value, "num_swa_groups", ">= 1", std::to_string(num_swa_groups));
  for (const auto& [count, name] : {std::pair{preset.num_layers, "num_layers"},
                                    std::pair{preset.num_mtp_layers, "num_mtp_layers"}})
    if (count < 0) check::fail(ErrorKind::value, name, ">= 0", std::to_string(count));
  const int64_t entries = int64_t(preset.num_layers) + preset.num_mtp_layers;
  if (int64_t(preset.compress_ratios.size()) != entries)
    check::fail(ErrorKind::value, "compress_ratios",
                "num_layers + num_mtp_layers = " + std::to_string(entries) + " entries",
                std::to_string(preset.compress_ratios.size()) + " entries");
  const int count = preset.num_layers + (with_mtp ? preset.num_mtp_layers : 0);
  std::vector<LayerSpec> layers;
  for (int l = 0; l < count; ++l) {
    LayerSpec s{.layer = l,
                .swa_group = l % num_swa_groups,
                .compress_ratio = preset.compress_ratios[size_t(l)],
                .num_heads = preset.num_heads,
                .window = preset.window,
                .mtp = l >= preset.num_layers};
    if (s.compress_ratio > 0) {
      s.kv_source = source_of(preset.kv_sources, l, "kv_sources");
      const bool every_entry = s.compress_ratio == preset.every_entry_ratio;
      s.index_source = every_entry ? l : source_of(preset.index_sources, l, "index_sources");
      s.index_topk = every_entry ? 0 : preset.index_topk;
    }
    layers.push_back(s);
  }
  return layers;
}

}  // namespace smla
