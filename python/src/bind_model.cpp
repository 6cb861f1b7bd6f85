// Model shapes (SPEC §6) and layer keys (SPEC §5): the layer specs tables and executors take.
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "smla/model.h"
#include "smla/tables.h"

namespace smla::py {

void bind_model(nb::module_& m) {
  nb::class_<LayerSpec>(m, "LayerSpec", "What one attention layer is (smla/model.h)")
      .def(
          "__init__",
          [](LayerSpec* s, int layer, int swa_group, int compress_ratio, int kv_source,
             int index_source, int index_topk, int num_heads, int window, bool mtp) {
            new (s) LayerSpec{layer,        swa_group,  compress_ratio, kv_source, index_source,
                              index_topk,   num_heads,  window,         mtp};
          },
          nb::kw_only(), nb::arg("layer") = 0, nb::arg("swa_group") = 0,
          nb::arg("compress_ratio") = 0, nb::arg("kv_source") = -1, nb::arg("index_source") = -1,
          nb::arg("index_topk") = 0, nb::arg("num_heads") = 0, nb::arg("window") = kWindow,
          nb::arg("mtp") = false)
      .def_rw("layer", &LayerSpec::layer)
      .def_rw("swa_group", &LayerSpec::swa_group)
      .def_rw("compress_ratio", &LayerSpec::compress_ratio)
      .def_rw("kv_source", &LayerSpec::kv_source)
      .def_rw("index_source", &LayerSpec::index_source)
      .def_rw("index_topk", &LayerSpec::index_topk)
      .def_rw("num_heads", &LayerSpec::num_heads)
      .def_rw("window", &LayerSpec::window)
      .def_rw("mtp", &LayerSpec::mtp)
      .def("__repr__", [](const LayerSpec& s) {
        return "LayerSpec(layer=" + std::to_string(s.layer) +
               ", swa_group=" + std::to_string(s.swa_group) +
               ", compress_ratio=" + std::to_string(s.compress_ratio) +
               ", kv_source=" + std::to_string(s.kv_source) +
               ", index_source=" + std::to_string(s.index_source) +
               ", index_topk=" + std::to_string(s.index_topk) +
               ", num_heads=" + std::to_string(s.num_heads) +
               ", window=" + std::to_string(s.window) + ", mtp=" + (s.mtp ? "True" : "False") +
               ")";
      });

  nb::class_<ModelPreset>(m, "ModelPreset", "A model's attention shapes (SPEC §6)")
      .def_ro("name", &ModelPreset::name)
      .def_ro("num_layers", &ModelPreset::num_layers)
      .def_ro("num_mtp_layers", &ModelPreset::num_mtp_layers)
      .def_ro("num_heads", &ModelPreset::num_heads)
      .def_ro("index_topk", &ModelPreset::index_topk)
      .def_ro("window", &ModelPreset::window)
      .def_ro("compress_ratios", &ModelPreset::compress_ratios)
      .def_ro("every_entry_ratio", &ModelPreset::every_entry_ratio)
      .def_ro("kv_sources", &ModelPreset::kv_sources)
      .def_ro("index_sources", &ModelPreset::index_sources)
      .def("__repr__", [](const ModelPreset& p) { return "ModelPreset('" + p.name + "')"; });

  m.def(
      "model_presets",
      [] {
        const auto presets = model_presets();
        return std::vector<ModelPreset>(presets.begin(), presets.end());
      },
      "Every preset (SPEC §6): v4-flash, v4-pro, v41-flash; model_preset(name) gives one.");
  m.def("model_preset", &model_preset, nb::arg("name"), nb::rv_policy::copy);
  m.def("model_layers", &model_layers, nb::arg("preset"), nb::arg("num_swa_groups"),
        nb::arg("with_mtp") = false);
  m.def("topk_width", &topk_width, nb::arg("layer"), nb::arg("max_seq_len"));
  nb::enum_<TableSharing>(m, "TableSharing",
                          "Whether layers of equal keys in an SWA group share a table (shared, "
                          "SPEC §5) or every layer has its own (none: what sharing saves).")
      .value("shared", TableSharing::shared)
      .value("none", TableSharing::none);
  m.def("sparse_index_key", &sparse_index_key, nb::arg("layer"),
        nb::arg("sharing") = TableSharing::shared);
}

}  // namespace smla::py
