// The CPU reference of SPEC §2. One work item is a (token, group of heads): it gathers the
// token's attended rows once, each as 512 unscaled floats plus one power-of-two scale per
// 64 values, so dot products run over unscaled values (no float overflow with large UE8M0
// scales) and scales, softmax sums and outputs are applied and accumulated in double.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/index_rules.h"
#include "core/numeric.h"
#include "cpu/backend.h"
#include "cpu/index.h"
#include "cpu/parallel.h"

namespace smla::cpu {
namespace {

constexpr int kGroups = kHeadDim / kDsMlaGroup;  // 7 NoPE groups, then the RoPE group
constexpr int kHeadsPerItem = 16;           // enough items to spread small batches over threads

const std::array<float, 256> kE4m3 = [] {
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = e4m3_to_float(static_cast<uint8_t>(i));
  return table;
}();

float load_bf16(const std::byte* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return bf16_to_float(bits);
}

float load_e4m3(const std::byte* p) { return kE4m3[static_cast<uint8_t>(*p)]; }

// The attended rows of one token, in column order (an offset attended twice appears twice).
struct Rows {
  int64_t count = 0;
  std::vector<float> values;   // count x 512
  std::vector<double> scales;  // count x kGroups

  void append(const KvPool& pool, int64_t offset) {
    values.resize((count + 1) * kHeadDim);
    scales.resize((count + 1) * kGroups, 1.0);
    float* v = &values[count * kHeadDim];
    double* s = &scales[count * kGroups];
    const std::byte* src = pool.row(offset);
    switch (pool.layout) {
      case KvLayout::bf16:
        for (int d = 0; d < kHeadDim; ++d) v[d] = load_bf16(src + 2 * d);
        break;
      case KvLayout::fp8_e4m3:
        for (int d = 0; d < kHeadDim; ++d) v[d] = load_e4m3(src + d);
        break;
      case KvLayout::fp8_ds_mla: {
        for (int d = 0; d < kNopeDim; ++d) v[d] = load_e4m3(src + d);
        for (int d = 0; d < kRopeDim; ++d) v[kNopeDim + d] = load_bf16(src + kNopeDim + 2 * d);
        const uint8_t* e = pool.ds_mla_scales(offset);
        for (int g = 0; g < kNopeDim / kDsMlaGroup; ++g) s[g] = ue8m0_to_double(e[g]);
        break;
      }
    }
    ++count;
  }
};

// Where a token's row stands: its request, position and SWA length min(pos + 1, W).
struct TokenRow {
  int64_t request = 0, pos = 0, swa_len = 0;
};

// A token's columns as its table holds them, or (TopkColumns) as that table's build would
// write them: the same bits, and the same error for a top-k entry past the block table.
class Columns {
 public:
  Columns(const DecodeProblem& p, const DecodeArgs& a) : p_(p), a_(a) {}

  int64_t len(int64_t t, const TokenRow& row) const {
    if (!p_.topk_columns) return check::at(a_.sparse_topk_lens, t);
    const TopkColumns& c = a_.topk_columns;
    const TensorView& valid = c.is_valid_token;
    if (valid.defined() && !valid.ptr<const uint8_t>()[t * valid.stride(0)]) return p_.window;
    if (row.request >= c.num_decodes)
      return p_.window + rules::topk_used(false, row.pos, c.compress_ratio, p_.top_k);
    int64_t count = 0;
    for (int64_t j = 0; j < p_.top_k; ++j) {
      count += check::at(c.topk_indices, t, j) >= 0;
      // The builder converts every entry of a decode row, also those past its length (after
      // a -1): converted here too, for the same error at an entry past the block table.
      at(t, row, p_.window + j);
    }
    return p_.window + count;
  }

  int32_t at(int64_t t, const TokenRow& row, int64_t col) const {
    if (!p_.topk_columns || col < p_.window) return check::at(a_.sparse_indices, t, col);
    const TopkColumns& c = a_.topk_columns;
    const int64_t j = col - p_.window;
    if (j >= p_.top_k) return -1;
    return topk_entry_offset(check::at(c.topk_indices, t, j), t, j, row.request, c.block_table,
                             p_.compressed, "topk_columns.topk_indices",
                             "topk_columns.block_table");
  }

 private:
  const DecodeProblem& p_;
  const DecodeArgs& a_;
};

// Rules 1-3 of SPEC §2; rows of masked columns are never read.
Rows gather(const DecodeProblem& p, const Columns& columns, int64_t t, const TokenRow& row) {
  const int64_t len = columns.len(t, row);
  Rows rows;
  for (int64_t c = 0; c < std::min(len, p.num_columns); ++c) {
    const bool swa = c < p.window;
    if (swa && c >= row.swa_len) continue;
    const KvPool& pool = swa ? p.swa : p.compressed;
    const int32_t offset = columns.at(t, row, c);
    if (pool.valid(offset)) rows.append(pool, offset);
  }
  return rows;
}

float dot64(const float* a, const float* b) {
  float lane[8] = {};
  for (int i = 0; i < kDsMlaGroup; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

struct HeadResult {
  std::array<double, kHeadDim> out{};
  double lse = -std::numeric_limits<double>::infinity();
};

// One head of one token: the formula of SPEC §2 with the row list already masked.
void attend(const Rows& rows, const float* q, const DecodeArgs& a, bool has_sink, float sink,
            HeadResult& r) {
  const int64_t n = rows.count;
  r = HeadResult{};
  if (n == 0) return;
  std::vector<double> s(n);
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int g = 0; g < kGroups; ++g)
      acc += rows.scales[j * kGroups + g] *
             dot64(q + g * kDsMlaGroup, &rows.values[j * kHeadDim + g * kDsMlaGroup]);
    s[j] = a.bmm1_scale * acc;
  }
  const double m_scores = *std::max_element(s.begin(), s.end());
  double sum_scores = 0;
  for (double x : s) sum_scores += std::exp(x - m_scores);
  r.lse = m_scores + std::log(sum_scores);  // never includes the sink, not even a +inf one
  if (has_sink && sink == std::numeric_limits<float>::infinity()) return;

  const double m = has_sink ? std::max<double>(m_scores, sink) : m_scores;
  double denom = has_sink ? std::exp(sink - m) : 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(s[j] - m);
    denom += p;
    const float* v = &rows.values[j * kHeadDim];
    for (int g = 0; g < kGroups; ++g) {
      const double w = p * rows.scales[j * kGroups + g];
      for (int d = g * kDsMlaGroup; d < (g + 1) * kDsMlaGroup; ++d) r.out[d] += w * v[d];
    }
  }
  const double factor = a.bmm2_scale / denom;
  for (double& x : r.out) x *= factor;
}

void load_query(const DecodeArgs& a, int64_t t, int h, float* q) {
  const int64_t at = t * a.query.stride(0) + h * a.query.stride(1);
  const auto* base = static_cast<const std::byte*>(a.query.data);
  if (a.query.dtype == DType::bf16) {
    for (int d = 0; d < kHeadDim; ++d) q[d] = load_bf16(base + 2 * (at + d));
  } else {
    for (int d = 0; d < kHeadDim; ++d) q[d] = load_e4m3(base + at + d);
  }
}

void store_out(const DecodeArgs& a, int64_t t, int h, const double* values) {
  uint16_t* dst = a.out.ptr<uint16_t>() + t * a.out.stride(0) + h * a.out.stride(1);
  for (int d = 0; d < kHeadDim; ++d) dst[d] = float_to_bf16(static_cast<float>(values[d]));
}

// pos(t) = seq_len[b] - q_len[b] + i for the i-th token of request b.
std::vector<TokenRow> token_rows(const DecodeProblem& p, const DecodeArgs& a) {
  std::vector<TokenRow> rows(p.num_tokens);
  const TensorView& cum = a.cum_seq_lens_q;
  auto i32 = [](const TensorView& v, int64_t i) { return v.ptr<const int32_t>()[i * v.stride(0)]; };
  for (int64_t b = 0; b < p.num_requests; ++b) {
    const int64_t begin = cum.defined() ? i32(cum, b) : b;
    const int64_t end = cum.defined() ? i32(cum, b + 1) : b + 1;
    const int64_t first_pos = i32(a.seq_lens, b) - (end - begin);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = first_pos + (t - begin);
      rows[t] = {b, pos, std::min<int64_t>(pos + 1, p.window)};
    }
  }
  return rows;
}

}  // namespace

void decode(const DecodeProblem& p, const DecodeArgs& a) {
  const std::vector<TokenRow> token = token_rows(p, a);
  const Columns columns(p, a);
  const int groups = (p.num_heads + kHeadsPerItem - 1) / kHeadsPerItem;
  parallel_for(p.num_tokens * groups, [&](int64_t item) {
    const int64_t t = item / groups;
    const int group = static_cast<int>(item % groups);
    const Rows rows = gather(p, columns, t, token[t]);
    std::array<float, kHeadDim> q;
    HeadResult r;
    const int h_end = std::min(p.num_heads, (group + 1) * kHeadsPerItem);
    for (int h = group * kHeadsPerItem; h < h_end; ++h) {
      load_query(a, t, h, q.data());
      const bool has_sink = a.sinks.defined();
      const float sink = has_sink ? a.sinks.ptr<const float>()[h * a.sinks.stride(0)] : 0.f;
      attend(rows, q.data(), a, has_sink, sink, r);
      store_out(a, t, h, r.out.data());
      if (a.lse.defined())
        a.lse.ptr<float>()[t * a.lse.stride(0) + h * a.lse.stride(1)] = static_cast<float>(r.lse);
    }
    if (group == 0) {
      r.out.fill(0.0);
      for (int h = p.num_heads; h < p.out_heads; ++h) store_out(a, t, h, r.out.data());
    }
  });
}

}  // namespace smla::cpu
