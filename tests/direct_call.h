// What a layer would run without shared tables: the decode call on a table built for it alone,
// with the arguments StepExecutor::run_layer passes. The executor tests' yardstick.
#pragma once
#include "smla/decode.h"
#include "smla/executor.h"
#include "smla/index.h"

namespace smla::test {

// Outputs for the table `a` describes, each from make(DType, std::initializer_list<int64_t>).
template <class Make>
SparseIndexTable table_outputs(const SparseIndexArgs& a, Make&& make) {
  const int64_t T = a.step.num_tokens, K = sparse_index_columns(a);
  const bool dspark = a.step.decode_swa_width > a.window;
  return {make(DType::i32, {T, K}), make(DType::i32, {T}),
          dspark ? make(DType::i32, {T}) : TensorView{}};
}

// `a` with its table built (on the device of a's tensors, on `stream`) into outputs from make.
template <class Make>
SparseIndexArgs built(SparseIndexArgs a, Make&& make, void* stream = nullptr) {
  a.out = table_outputs(a, make);
  build_sparse_indices(a, stream);
  return a;
}

// `a` without its compressed columns: the SWA-only table a layer reading its top-k looks up.
inline SparseIndexArgs swa_only(SparseIndexArgs a) {
  a.compressed = {};
  return a;
}

// `built` is the layer's SparseIndexArgs after build_sparse_indices wrote its `out`.
inline DecodeArgs direct_decode_args(const AttentionLayer& layer, const SparseIndexArgs& built,
                                     const TensorView& query, const TensorView& out) {
  const bool dspark = built.step.decode_swa_width > built.window;
  DecodeArgs d;
  d.query = query;
  d.out = out;
  d.swa_kv_cache = layer.swa_kv_cache;
  if (layer.spec.compress_ratio > 0) d.compressed_kv_cache = layer.compressed_kv_cache;
  d.sparse_indices = built.out.sparse_indices;
  d.sparse_topk_lens = built.out.sparse_topk_lens;
  d.seq_lens = dspark ? built.out.seq_lens : built.step.seq_lens;
  if (!dspark) d.cum_seq_lens_q = built.step.cum_seq_lens_q;
  d.max_q_len = dspark ? 1 : built.step.max_q_len;
  d.sinks = layer.sinks;
  d.bmm1_scale = layer.bmm1_scale;
  d.bmm2_scale = layer.bmm2_scale;
  d.window = layer.spec.window;
  return d;
}

// The same call with the compressed columns read from the top-k (TopkColumns): `swa` is the
// layer's SWA-only table (its SparseIndexArgs without compressed columns, built), `c` the
// compressed columns its own table would be built from.
inline DecodeArgs topk_decode_args(const AttentionLayer& layer, const SparseIndexArgs& swa,
                                   const CompressedColumns& c, const TensorView& query,
                                   const TensorView& out) {
  DecodeArgs d = direct_decode_args(layer, swa, query, out);
  d.compressed_kv_cache = c.compressed_kv_cache;
  d.sparse_topk_lens = {};
  d.topk_columns = {.topk_indices = c.topk_indices,
                    .block_table = c.block_table,
                    .is_valid_token = swa.step.is_valid_token,
                    .num_decodes = swa.step.num_decodes,
                    .compress_ratio = c.compress_ratio};
  return d;
}

}  // namespace smla::test
