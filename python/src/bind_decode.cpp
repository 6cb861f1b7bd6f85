// The decode op (SPEC §2) and its buffers (SPEC §3). Argument names are DecodeArgs' names.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>

#include "bindings.h"
#include "smla/decode.h"
#include "tensor_arg.h"

namespace smla::py {
namespace {

// Tensor arguments arrive as `_smla.Tensor` or None; the Python layer converted them.
void decode(nb::handle query, nb::handle swa_kv_cache, nb::handle compressed_kv_cache,
            nb::handle sparse_indices, nb::handle sparse_topk_lens, nb::handle seq_lens,
            nb::handle cum_seq_lens_q, int max_q_len, nb::handle sinks, float bmm1_scale,
            float bmm2_scale, nb::handle out, nb::handle lse, nb::handle workspace,
            nb::handle kv_counters, int window, nb::handle topk_indices,
            nb::handle topk_block_table, nb::handle is_valid_token, int64_t num_decodes,
            int compress_ratio, uintptr_t stream) {
  DecodeArgs a;
  a.query = take(query);
  a.swa_kv_cache = take(swa_kv_cache);
  a.compressed_kv_cache = take(compressed_kv_cache);
  a.sparse_indices = take(sparse_indices);
  a.sparse_topk_lens = take(sparse_topk_lens);
  a.seq_lens = take(seq_lens);
  a.cum_seq_lens_q = take(cum_seq_lens_q);
  a.max_q_len = max_q_len;
  a.sinks = take(sinks);
  a.bmm1_scale = bmm1_scale;
  a.bmm2_scale = bmm2_scale;
  a.out = take(out);
  a.lse = take(lse);
  a.workspace = take(workspace);
  a.kv_counters = take(kv_counters);
  a.window = window;
  a.topk_columns = {.topk_indices = take(topk_indices),
                    .block_table = take(topk_block_table),
                    .is_valid_token = take(is_valid_token),
                    .num_decodes = num_decodes,
                    .compress_ratio = compress_ratio};
  // The CPU backend is multithreaded and may run for a while: let other Python threads go.
  // The views stay valid: the caller's frame holds every Tensor until we return.
  nb::gil_scoped_release release;
  sparse_mla_decode(a, reinterpret_cast<void*>(stream));
}

}  // namespace

void bind_decode(nb::module_& m) {
  m.attr("HEAD_DIM") = kHeadDim;
  m.attr("NOPE_DIM") = kNopeDim;
  m.attr("ROPE_DIM") = kRopeDim;
  m.attr("MAX_HEADS") = kMaxHeads;
  m.attr("WINDOW") = kWindow;

  m.def("sparse_mla_decode", &decode, nb::arg("query").none(), nb::arg("swa_kv_cache").none(),
        nb::arg("compressed_kv_cache").none(), nb::arg("sparse_indices").none(),
        nb::arg("sparse_topk_lens").none(), nb::arg("seq_lens").none(),
        nb::arg("cum_seq_lens_q").none(), nb::arg("max_q_len"), nb::arg("sinks").none(),
        nb::arg("bmm1_scale"), nb::arg("bmm2_scale"), nb::arg("out").none(),
        nb::arg("lse").none(), nb::arg("workspace").none(), nb::arg("kv_counters").none(),
        nb::arg("window"), nb::arg("topk_indices").none(), nb::arg("topk_block_table").none(),
        nb::arg("is_valid_token").none(), nb::arg("num_decodes"), nb::arg("compress_ratio"),
        nb::arg("stream"));

  m.def("kv_counter_bytes", &kv_counter_bytes, nb::arg("max_tokens"), nb::arg("num_heads"));
  m.def(
      "workspace_bytes",
      [](int64_t max_tokens, int num_heads, int64_t max_columns, const std::string& kind,
         int id) {
        return workspace_bytes(max_tokens, num_heads, max_columns, parse_device(kind, id));
      },
      nb::arg("max_tokens"), nb::arg("num_heads"), nb::arg("max_columns"), nb::arg("kind"),
      nb::arg("id"));
  m.def(
      "query_capability",
      [](int head_size, const std::string& query_dtype, const std::string& kv_dtype,
         int block_size, const std::string& kind, int id) {
        const Capability c =
            query_capability(head_size, parse_dtype(query_dtype, "query_dtype"),
                             parse_dtype(kv_dtype, "kv_dtype"), block_size, parse_device(kind, id));
        return std::make_tuple(c.supported, c.reason);
      },
      nb::arg("head_size"), nb::arg("query_dtype"), nb::arg("kv_dtype"), nb::arg("block_size"),
      nb::arg("kind"), nb::arg("id"));
  m.def(
      "max_topk_width",
      [](const std::string& kind, int id) { return max_topk_width(parse_device(kind, id)); },
      nb::arg("kind"), nb::arg("id"));
  m.def("backend_info", &backend_info);
}

}  // namespace smla::py
