// Model shapes (SPEC §6): the attention layers of the DeepSeek-V4 family as layer specs, the
// common language of SparseIndexTables, StepExecutor, the tests and the `smla` command.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "smla/decode.h"

namespace smla {

// What one attention layer is, independent of any step's data.
struct LayerSpec {
  int layer = 0;           // index in the model; MTP layers follow the main ones
  int swa_group = 0;       // SWA KV-cache group (whose block table its SWA columns use)
  int compress_ratio = 0;  // 0: SWA-only
  int kv_source = -1;      // the compressed cache it reads, named by the layer that writes it
  int index_source = -1;   // the layer whose local top-k it reads
  int index_topk = 0;      // top-k width; 0 with compress_ratio > 0: every compressed entry
  int num_heads = 0;       // query heads (one KV head)
  int window = kWindow;    // W
  bool mtp = false;        // a multi-token-prediction (draft) layer
};

// Columns of the top-k a layer reads for KV lengths up to max_seq_len (0 for SWA-only layers).
// A negative max_seq_len, compress_ratio or index_topk, or a window below 1, throws smla::Error.
int64_t topk_width(const LayerSpec& layer, int64_t max_seq_len);

struct ModelPreset {
  std::string name;  // as `smla run --model` spells it
  int num_layers = 0;
  int num_mtp_layers = 0;
  int num_heads = 0;
  int index_topk = 0;
  int window = kWindow;
  std::vector<int> compress_ratios = {};  // num_layers + num_mtp_layers entries
  int every_entry_ratio = 0;  // layers of this ratio read every compressed entry (no indexer)
  std::vector<int> kv_sources = {};     // empty: every compressed layer writes its own cache
  std::vector<int> index_sources = {};  // empty: every indexed layer is its own index source
};

std::span<const ModelPreset> model_presets();  // v4-flash, v4-pro, v41-flash
// Throws smla::Error (argument "name") listing the names when there is none called `name`.
const ModelPreset& model_preset(std::string_view name);

// The layers of `preset` in order (main ones, then MTP ones when with_mtp), layer l in SWA
// group l % num_swa_groups; a compressed layer reads the latest kv / index source at or below it.
// Throws smla::Error naming the field where the preset's counts or compress_ratios disagree.
std::vector<LayerSpec> model_layers(const ModelPreset& preset, int num_swa_groups,
                                    bool with_mtp = false);

}  // namespace smla
