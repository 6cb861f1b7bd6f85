#include "cpu/index.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/index_rules.h"
#include "cpu/parallel.h"

namespace smla::cpu {
namespace {

// Tokens per parallel task: a decode step's few rows run on the caller's thread.
constexpr int64_t kTokensPerTask = 64;

std::string num(int64_t v) { return std::to_string(v); }

// SPEC §4's storage offset of a slot in `pool`'s pages.
int32_t storage_offset(int64_t slot, const KvPool& pool) {
  return rules::storage_offset(slot, pool.block_size, pool.span);
}

class RowWriter {
 public:
  RowWriter(const IndexProblem& p, const SparseIndexArgs& a) : p_(p), a_(a) {}

  // Token t, the i-th of request b.
  void write(int64_t t, int64_t b, int64_t i, int64_t q_len) const {
    const int64_t seq_len = check::at(a_.step.seq_lens, b);
    const TensorView& is_valid = a_.step.is_valid_token;
    if (is_valid.defined() && !is_valid.ptr<const uint8_t>()[t * is_valid.strides[0]]) {
      padding_row(t);
      if (p_.dspark) set_seq_len(t, seq_len);
      return;
    }
    const rules::Window w = rules::swa_window(seq_len, q_len, i, p_.window, p_.dspark);
    if (p_.dspark) return dspark_row(t, b, w, seq_len);
    swa_columns(t, b, w.start, w.end, p_.window);
    // An SWA-only layer's causal table is W wide: no compressed columns to pad.
    set_len(t, p_.window + (p_.compress_ratio > 0 ? compressed_columns(t, b, w.end - 1) : 0));
  }

 private:
  int32_t& index(int64_t t, int64_t c) const {
    const TensorView& v = a_.out.sparse_indices;
    return v.ptr<int32_t>()[t * v.strides[0] + c * v.strides[1]];
  }
  void fill(int64_t t, int64_t from, int64_t to) const {
    for (int64_t c = from; c < to; ++c) index(t, c) = -1;
  }
  void set_len(int64_t t, int64_t len) const {
    const TensorView& v = a_.out.sparse_topk_lens;
    v.ptr<int32_t>()[t * v.strides[0]] = static_cast<int32_t>(len);
  }
  void set_seq_len(int64_t t, int64_t seq_len) const {
    const TensorView& v = a_.out.seq_lens;
    v.ptr<int32_t>()[t * v.strides[0]] = static_cast<int32_t>(seq_len);
  }

  // An invalid (padding) token attends nothing: every column -1, length W + 0.
  void padding_row(int64_t t) const {
    fill(t, 0, p_.num_columns);
    set_len(t, p_.window);
  }

  // Columns [0, last) hold positions [start, end) of request b's SWA pages, then -1. The clamp
  // only bites on values another thread changed since validation: no write leaves the row.
  void swa_columns(int64_t t, int64_t b, int64_t start, int64_t end, int64_t last) const {
    end = std::clamp(end, start, start + last);
    const TensorView& table = a_.swa.block_table;
    const int64_t block_size = p_.swa.block_size;
    for (int64_t pos = start; pos < end; ++pos) {
      const int64_t page = pos / block_size;
      if (page >= table.size(1))
        check::fail(ErrorKind::value, "block_table",
                    "a page for position " + num(pos) + " of request " + num(b) +
                        " (>= " + num(page + 1) + " pages)",
                    check::shape_of(table));
      index(t, pos - start) =
          storage_offset(rules::slot(check::at(table, b, page), block_size, pos), p_.swa);
    }
    fill(t, end - start, last);
  }

  // Columns [W, K) from the index source's local top-k; returns the compressed length.
  int64_t compressed_columns(int64_t t, int64_t b, int64_t pos) const {
    const CompressedColumns& c = a_.compressed;
    const bool decode = b < p_.num_decodes;
    // A decode token's top-k is -1 padded; a prefill token's is valid up to what it can see.
    const int64_t used = rules::topk_used(decode, pos, p_.compress_ratio, p_.top_k);
    const int64_t len = decode ? decode_topk_count(c.topk_indices, t, used, "topk_indices") : used;
    for (int64_t j = 0; j < used; ++j)
      index(t, p_.window + j) =
          topk_entry_offset(check::at(c.topk_indices, t, j), t, j, b, c.block_table, p_.compressed,
                            "topk_indices", "compressed.block_table");
    fill(t, p_.window + used, p_.num_columns);
    return len;
  }

  // DSpark: every token of the draft block sees [max(seq_len - q_len - W, 0), seq_len) and
  // becomes its own request of that seq_len.
  void dspark_row(int64_t t, int64_t b, rules::Window w, int64_t seq_len) const {
    swa_columns(t, b, w.start, w.end, p_.num_columns);
    set_len(t, std::max<int64_t>(w.end - w.start, p_.window));
    set_seq_len(t, seq_len);
  }

  const IndexProblem& p_;
  const SparseIndexArgs& a_;
};

}  // namespace

int32_t topk_entry_offset(int64_t x, int64_t t, int64_t j, int64_t b, const TensorView& block_table,
                          const KvPool& pool, const char* topk_name, const char* table_name) {
  if (x < 0) return static_cast<int32_t>(x);
  const int64_t E = pool.block_size;  // compressed entries a page
  if (x / E >= block_table.size(1))
    check::fail(ErrorKind::value, topk_name,
                std::string("local indices below ") + table_name +
                    " pages * E = " + num(block_table.size(1) * E),
                std::string(topk_name) + "[" + num(t) + "][" + num(j) + "] = " + num(x));
  return rules::topk_offset(static_cast<int32_t>(x), check::at(block_table, b, x / E), E,
                            pool.span);
}

int64_t decode_topk_count(const TensorView& topk, int64_t t, int64_t top_k, const char* topk_name) {
  int64_t count = 0;
  for (int64_t j = 0; j < top_k; ++j) {
    const int64_t x = check::at(topk, t, j);
    if (x >= 0 && count < j)
      check::fail(ErrorKind::value, topk_name,
                  "a decode token's entries -1 padded, the valid ones (>= 0) first (SPEC §4)",
                  std::string(topk_name) + "[" + num(t) + "][" + num(j) + "] = " + num(x) +
                      " after [" + num(count) + "] = " + num(check::at(topk, t, count)));
    count += x >= 0;
  }
  return count;
}

void build_sparse_indices(const IndexProblem& p, const SparseIndexArgs& a) {
  const TensorView& cum = a.step.cum_seq_lens_q;
  auto start = [&](int64_t b) -> int64_t { return cum.defined() ? check::at(cum, b) : b; };
  const RowWriter writer(p, a);
  const int64_t tasks = (p.num_tokens + kTokensPerTask - 1) / kTokensPerTask;
  parallel_for(tasks, [&](int64_t task) {
    const int64_t first = task * kTokensPerTask;
    const int64_t last = std::min(first + kTokensPerTask, p.num_tokens);
    for (int64_t t = first, b = rules::request_of(first, p.num_requests, start); t < last; ++t) {
      // b + 1 < B: starts another thread changed since validation stay inside the requests.
      while (b + 1 < p.num_requests && start(b + 1) <= t) ++b;
      writer.write(t, b, t - start(b), start(b + 1) - start(b));
    }
  });
}

}  // namespace smla::cpu
