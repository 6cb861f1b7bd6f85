// Sparse-index table builders (SPEC §4). Field names are those of index.h's structs; the
// Python layer's dataclasses flatten into make_step_metadata (StepMetadata) and
// make_index_args (the rest).
#include <nanobind/stl/string.h>

#include <cstdint>

#include "bindings.h"
#include "index_args.h"

namespace smla::py {
namespace {

StepArgs make_step_metadata(int64_t num_tokens, nb::handle seq_lens, nb::handle cum_seq_lens_q,
                            nb::handle is_valid_token, int64_t num_decodes, int max_q_len,
                            int decode_swa_width) {
  StepArgs r;
  StepMetadata& s = r.step;
  s.num_tokens = num_tokens;
  s.seq_lens = take(seq_lens, &r.keep);
  s.cum_seq_lens_q = take(cum_seq_lens_q, &r.keep);
  s.is_valid_token = take(is_valid_token, &r.keep);
  s.num_decodes = num_decodes;
  s.max_q_len = max_q_len;
  s.decode_swa_width = decode_swa_width;
  return r;
}

IndexArgs make_index_args(nb::handle step, nb::handle block_table, nb::handle swa_kv_cache,
                          int compress_ratio, nb::handle topk_indices,
                          nb::handle compressed_block_table, nb::handle compressed_kv_cache,
                          int window, nb::handle sparse_indices, nb::handle sparse_topk_lens,
                          nb::handle out_seq_lens) {
  IndexArgs r;
  SparseIndexArgs& a = r.args;
  a.step = take_step(step, r.keep);
  a.swa.block_table = take(block_table, &r.keep);
  a.swa.swa_kv_cache = take(swa_kv_cache, &r.keep);
  a.compressed.compress_ratio = compress_ratio;
  a.compressed.topk_indices = take(topk_indices, &r.keep);
  a.compressed.block_table = take(compressed_block_table, &r.keep);
  a.compressed.compressed_kv_cache = take(compressed_kv_cache, &r.keep);
  a.window = window;
  a.out.sparse_indices = take(sparse_indices, &r.keep);
  a.out.sparse_topk_lens = take(sparse_topk_lens, &r.keep);
  a.out.seq_lens = take(out_seq_lens, &r.keep);
  return r;
}

}  // namespace

void bind_index(nb::module_& m) {
  nb::class_<IndexArgs>(m, "IndexArgs", "smla::SparseIndexArgs with the arrays it views");

  nb::class_<StepArgs>(m, "StepMetadata", "smla::StepMetadata with the arrays it views");
  m.def("make_step_metadata", &make_step_metadata, nb::arg("num_tokens"),
        nb::arg("seq_lens").none(), nb::arg("cum_seq_lens_q").none(),
        nb::arg("is_valid_token").none(), nb::arg("num_decodes"), nb::arg("max_q_len"),
        nb::arg("decode_swa_width"));
  m.def("make_index_args", &make_index_args, nb::arg("step"), nb::arg("block_table").none(),
        nb::arg("swa_kv_cache").none(), nb::arg("compress_ratio"), nb::arg("topk_indices").none(),
        nb::arg("compressed_block_table").none(), nb::arg("compressed_kv_cache").none(),
        nb::arg("window"), nb::arg("sparse_indices").none(), nb::arg("sparse_topk_lens").none(),
        nb::arg("out_seq_lens").none());

  m.def(
      "build_sparse_indices",
      [](const IndexArgs& args, uintptr_t stream) {
        nb::gil_scoped_release release;  // multithreaded on the CPU; args holds the arrays
        build_sparse_indices(args.args, reinterpret_cast<void*>(stream));
      },
      nb::arg("args"), nb::arg("stream"));

  m.def("sparse_index_columns",
        nb::overload_cast<int, int64_t, int>(&sparse_index_columns), nb::arg("window"),
        nb::arg("top_k"), nb::arg("decode_swa_width") = 0);
  m.def("dspark_swa_width", &dspark_swa_width, nb::arg("window"), nb::arg("num_draft_tokens"));
}

}  // namespace smla::py
