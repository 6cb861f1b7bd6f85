// One bind_* function per part of the API; module.cpp calls them in order.
#pragma once
#include <nanobind/nanobind.h>

namespace smla::py {

namespace nb = nanobind;

void bind_errors(nb::module_& m);    // smla::Error -> TypeError / ValueError / ...
void bind_tensor(nb::module_& m);    // _smla.Tensor
void bind_decode(nb::module_& m);    // sparse_mla_decode, counters, workspace, capability
void bind_index(nb::module_& m);     // IndexArgs, build_sparse_indices, column helpers
void bind_model(nb::module_& m);     // LayerSpec, ModelPreset, model_layers, sparse_index_key
void bind_tables(nb::module_& m);    // SparseIndexTables
void bind_executor(nb::module_& m);  // StepExecutor
void bind_quantize(nb::module_& m);  // quantize_kv

}  // namespace smla::py
