// Argument checks of the index builders. Block-table and top-k values are checked by the CPU
// backend as it reads them; a device backend cannot read them without a synchronisation.
#include <string>

#include "core/check.h"
#include "core/index_problem.h"

namespace smla {
namespace {

using check::fail;
using check::num;
using check::shape_of;

void check_step(const StepMetadata& s, IndexProblem& p) {
  check::int32_count(s.num_tokens, "num_tokens");
  p.num_tokens = s.num_tokens;
  const std::string T = num(s.num_tokens);
  check::tensor(s.seq_lens, "seq_lens", DType::i32, p.device, {-1}, "[B] i32");
  p.num_requests = s.seq_lens.size(0);
  // As the decode refuses it: B + 1 (cum_seq_lens_q's size) must not overflow.
  if (p.num_requests > INT32_MAX - 1)
    fail(ErrorKind::unsupported, "seq_lens", "[B] with B < 2^31 - 1", shape_of(s.seq_lens));
  if (s.cum_seq_lens_q.defined())
    check::tensor(s.cum_seq_lens_q, "cum_seq_lens_q", DType::i32, p.device, {p.num_requests + 1},
                  "[B+1 = " + num(p.num_requests + 1) + "] i32");
  else if (p.num_requests != p.num_tokens)
    fail(ErrorKind::value, "seq_lens", "[B = T = " + T + "] (cum_seq_lens_q absent)",
         shape_of(s.seq_lens));
  if (s.is_valid_token.defined())
    check::tensor(s.is_valid_token, "is_valid_token", DType::u8, p.device, {p.num_tokens},
                  "[T = " + T + "] u8");
  if (s.num_decodes < 0 || s.num_decodes > p.num_requests)
    fail(ErrorKind::value, "num_decodes", "0..B = " + num(p.num_requests), num(s.num_decodes));
  p.num_decodes = s.num_decodes;
  // What the decode op is told: refused here as it would be there (host values below).
  if (s.max_q_len < 1) fail(ErrorKind::value, "max_q_len", ">= 1", num(s.max_q_len));
  check::int32_count(s.decode_swa_width, "decode_swa_width");  // 0..window: causal, not < 0
}

// seq_lens and cum_seq_lens_q, read on the CPU: request b's tokens are [cum[b], cum[b+1]).
// A device's are not read (that would synchronise); T <= B x max_q_len, which they imply, is
// checked instead, so that a T they disagree with cannot size a table past the step's.
void check_step_values(const StepMetadata& s, const IndexProblem& p) {
  if (p.device.kind != DeviceKind::cpu) {
    if (p.num_requests == 0 && p.num_tokens > 0)  // the CPU finds it reading cum_seq_lens_q
      fail(ErrorKind::value, "cum_seq_lens_q", "a request for the " + num(p.num_tokens) + " tokens",
           "B = 0");
    if (p.num_tokens > p.num_requests * s.max_q_len)
      fail(ErrorKind::value, "num_tokens",
           "<= B x max_q_len = " + num(p.num_requests) + " x " + num(s.max_q_len) +
               " (every request's q_len is at most max_q_len)",
           num(p.num_tokens));
    return;
  }
  check::step_requests(s.seq_lens, s.cum_seq_lens_q, p.num_requests, p.num_tokens,
                       [&](int64_t b, int64_t q_len) {
                         if (q_len > s.max_q_len)
                           fail(ErrorKind::value, "max_q_len",
                                ">= every q_len (request " + num(b) + " has q_len " + num(q_len) +
                                    ")",
                                num(s.max_q_len));
                         // The whole draft block sees one window of up to W + q_len positions.
                         if (p.dspark && q_len > p.num_columns - p.window)
                           fail(ErrorKind::value, "cum_seq_lens_q",
                                "q_len <= decode_swa_width - window = " +
                                    num(p.num_columns - p.window),
                                "q_len " + num(q_len) + " for request " + num(b));
                       });
}

void check_block_table(const TensorView& table, const char* name, const IndexProblem& p) {
  check::tensor(table, name, DType::i32, p.device, {-1, -1}, "[>= B, pages] i32");
  if (table.size(0) < p.num_requests)
    fail(ErrorKind::value, name, "[>= B = " + num(p.num_requests) + ", pages]", shape_of(table));
}

KvPool check_pool(const TensorView& pool, const char* name, const IndexProblem& p) {
  KvPool geometry = make_pool(pool, name);
  if (!(pool.device == p.device))
    fail(ErrorKind::type, name, device_name(p.device) + " (the device of the call)",
         device_name(pool.device));
  return geometry;
}

// Every input of the call on `device` (not the outputs, nor the host values).
IndexProblem check_inputs(const SparseIndexArgs& a, Device device) {
  IndexProblem p;
  p.device = device;
  if (a.window < 1) fail(ErrorKind::value, "window", ">= 1", num(a.window));
  p.window = a.window;
  check_step(a.step, p);
  const std::string T = num(p.num_tokens);

  p.dspark = a.step.decode_swa_width > a.window;
  p.compress_ratio = a.compressed.compress_ratio;  // < 0: refused by sparse_index_columns
  if (p.dspark && p.num_decodes != p.num_requests)
    fail(ErrorKind::value, "num_decodes",
         "B = " + num(p.num_requests) + " (the DSpark window is decode-only)", num(p.num_decodes));

  check_block_table(a.swa.block_table, "block_table", p);
  p.swa = check_pool(a.swa.swa_kv_cache, "swa_kv_cache", p);
  if (p.compress_ratio > 0) {
    const CompressedColumns& c = a.compressed;
    check::tensor(c.topk_indices, "topk_indices", DType::i32, p.device, {p.num_tokens, -1},
                  "[T = " + T + ", top_k] i32");
    p.top_k = c.topk_indices.size(1);
    check_block_table(c.block_table, "compressed.block_table", p);
    p.compressed = check_pool(c.compressed_kv_cache, "compressed_kv_cache", p);
  }
  p.num_columns = sparse_index_columns(a);  // and a DSpark width's rules, with compress_ratio's
  return p;
}

}  // namespace

IndexProblem validate_index(const SparseIndexArgs& a) {
  if (!a.out.sparse_indices.defined())
    fail(ErrorKind::value, "sparse_indices", "a [T, K] i32 tensor", "absent");
  // The call's device: refused here, by its tensor's name, rather than as the first input's
  // mismatch with it.
  check::device(a.out.sparse_indices.device, "sparse_indices");
  IndexProblem p = check_inputs(a, a.out.sparse_indices.device);
  const int ratio = p.compress_ratio;
  const std::string T = num(p.num_tokens);
  const std::string K = num(p.num_columns);
  check::tensor(a.out.sparse_indices, "sparse_indices", DType::i32, p.device,
                {p.num_tokens, p.num_columns}, "[T = " + T + ", K = " + K + "] i32");
  check::tensor(a.out.sparse_topk_lens, "sparse_topk_lens", DType::i32, p.device, {p.num_tokens},
                "[T = " + T + "] i32");
  check::disjoint(a.out.sparse_indices, "sparse_indices");
  check::disjoint(a.out.sparse_topk_lens, "sparse_topk_lens");
  if (p.dspark) {
    check::tensor(a.out.seq_lens, "out.seq_lens", DType::i32, p.device, {p.num_tokens},
                  "[T = " + T + "] i32 (DSpark: one request per token)");
    check::disjoint(a.out.seq_lens, "out.seq_lens");
  } else if (a.out.seq_lens.defined())
    fail(ErrorKind::value, "out.seq_lens", "absent (only the DSpark window writes it)",
         describe(a.out.seq_lens));
  const TensorView ignored{};  // a layer without a ratio reads no compressed columns
  // fp8_ds_mla pools' pages reach past their views (the scale footers): their records' bytes.
  const TensorView swa_records = pool_records(a.swa.swa_kv_cache, p.swa);
  const TensorView compressed_records =
      ratio > 0 ? pool_records(a.compressed.compressed_kv_cache, p.compressed) : ignored;
  check::all_apart({{a.out.sparse_indices, "sparse_indices"},
                    {a.out.sparse_topk_lens, "sparse_topk_lens"},
                    {a.out.seq_lens, "out.seq_lens"}},
                   {{a.step.seq_lens, "seq_lens"},
                    {a.step.cum_seq_lens_q, "cum_seq_lens_q"},
                    {a.step.is_valid_token, "is_valid_token"},
                    {a.swa.block_table, "block_table"},
                    {a.swa.swa_kv_cache, "swa_kv_cache"},
                    {swa_records, "swa_kv_cache"},
                    {ratio > 0 ? a.compressed.topk_indices : ignored, "topk_indices"},
                    {ratio > 0 ? a.compressed.block_table : ignored, "compressed.block_table"},
                    {ratio > 0 ? a.compressed.compressed_kv_cache : ignored, "compressed_kv_cache"},
                    {compressed_records, "compressed_kv_cache"}});

  check_step_values(a.step, p);
  return p;
}

void validate_index_inputs(const SparseIndexArgs& a, Device device) {
  check_step_values(a.step, check_inputs(a, device));
}

}  // namespace smla
