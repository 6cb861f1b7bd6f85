// The CPU reference of SPEC §2. A token's attended rows are gathered once per thread that
// works on it, each as 512 unscaled floats plus one power-of-two scale per 64 values, so dot
// products run over unscaled values (no float overflow with large UE8M0 scales) and scales,
// softmax sums and outputs are applied and accumulated in double.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/index_rules.h"
#include "core/numeric.h"
#include "cpu/backend.h"
#include "cpu/fp_mode.h"
#include "cpu/index.h"
#include "cpu/parallel.h"
#include "cpu/simd.h"

namespace smla::cpu {
namespace {

constexpr int kGroups = kHeadDim / kDsMlaGroup;  // 7 NoPE groups, then the RoPE group

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
// Gathering another token reuses the storage.
struct Rows {
  int64_t count = 0, capacity = 0;
  std::unique_ptr<float[]> values;   // count x 512
  std::unique_ptr<double[]> scales;  // count x kGroups

  void clear() { count = 0; }

  // Storage follows the rows appended, not the columns a row has: a row of 2^24 columns of
  // padding would otherwise take 32 GiB a thread (std::bad_alloc) to attend nothing. Left
  // uninitialized past the rows kept: only the rows appended are written.
  void append(const KvPool& pool, int64_t offset) {
    if (count == capacity) {
      const int64_t grown = std::max<int64_t>(2 * capacity, 64);
      auto more_values = std::make_unique_for_overwrite<float[]>(grown * kHeadDim);
      auto more_scales = std::make_unique_for_overwrite<double[]>(grown * kGroups);
      std::copy_n(values.get(), count * kHeadDim, more_values.get());
      std::copy_n(scales.get(), count * kGroups, more_scales.get());
      values = std::move(more_values);
      scales = std::move(more_scales);
      capacity = grown;
    }
    float* v = &values[count * kHeadDim];
    double* s = &scales[count * kGroups];
    const std::byte* src = pool.row(offset);
    switch (pool.layout) {
      case KvLayout::bf16:
        for (int d = 0; d < kHeadDim; ++d) v[d] = load_bf16(src + 2 * d);
        std::fill(s, s + kGroups, 1.0);
        break;
      case KvLayout::fp8_e4m3:
        for (int d = 0; d < kHeadDim; ++d) v[d] = load_e4m3(src + d);
        std::fill(s, s + kGroups, 1.0);
        break;
      case KvLayout::fp8_ds_mla: {
        for (int d = 0; d < kNopeDim; ++d) v[d] = load_e4m3(src + d);
        for (int d = 0; d < kRopeDim; ++d) v[kNopeDim + d] = load_bf16(src + kNopeDim + 2 * d);
        const uint8_t* e = pool.ds_mla_scales(offset);
        for (int g = 0; g < kNopeDim / kDsMlaGroup; ++g) s[g] = ue8m0_to_double(e[g]);
        s[kGroups - 1] = 1.0;
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
// write them: the same bits, and the same errors for a top-k entry past the block table or, in
// a decode row, a valid one after a negative one.
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
    // Valid entries first (the builder's error otherwise): the gather converts each of them,
    // with the builder's error at an entry past the block table; the rest are negative.
    return p_.window + decode_topk_count(c.topk_indices, t, p_.top_k, "topk_columns.topk_indices");
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

// Rules 1-3 of SPEC §2 into `rows`; rows of masked columns are never read.
void gather(const DecodeProblem& p, const Columns& columns, int64_t t, const TokenRow& row,
            Rows& rows) {
  const int64_t len = std::min(columns.len(t, row), p.num_columns);
  rows.clear();
  for (int64_t c = 0; c < len; ++c) {
    const bool swa = c < p.window;
    if (swa && c >= row.swa_len) continue;
    const KvPool& pool = swa ? p.swa : p.compressed;
    const int32_t offset = columns.at(t, row, c);
    if (pool.valid(offset)) rows.append(pool, offset);
  }
}

// Heads whose scores and P.V share each pass over the rows: a row is read from memory once
// per block instead of once per head, and the block's outputs (4 x 4 KiB) stay in L1.
constexpr int kHeadBlock = 4;

// s[h * n + j]: the score of head h for row j, q[h] . row j: each 64-value group's float
// products summed in 8 lanes, the group's sum under the row's scale for it added in double. The
// B heads go through a group together: B independent chains for the out-of-order core.
template <int B>
SMLA_CPU_CLONES void scores(const Rows& rows, const float (&q)[B][kHeadDim], double bmm1,
                            double* s) {
  const int64_t n = rows.count;
  for (int64_t j = 0; j < n; ++j) {
    const float* v = &rows.values[j * kHeadDim];
    double acc[B] = {};
    for (int g = 0; g < kGroups; ++g) {
      F8 lane[B] = {};
      for (int i = g * kDsMlaGroup; i < (g + 1) * kDsMlaGroup; i += 8) {
        const F8 x = at8<F8>(v + i);
        for (int h = 0; h < B; ++h) lane[h] += at8<F8>(q[h] + i) * x;
      }
      for (int h = 0; h < B; ++h) acc[h] += rows.scales[j * kGroups + g] * sum8(lane[h]);
    }
    for (int h = 0; h < B; ++h) s[h * n + j] = bmm1 * acc[h];
  }
}

constexpr float kZeroRow[kHeadDim] = {};

// out[h] = sum over rows j, in order, of e[h * n + j] * row j, in double: out += w0 * x0 + w1 *
// x1 in that order, rows in pairs to halve the loads and stores of `out`, each 8 values of a
// pair converted once for the B heads.
template <int B>
SMLA_CPU_CLONES void weighted_sum(const Rows& rows, const double* e, double (&out)[B][kHeadDim]) {
  const int64_t n = rows.count;
  for (int64_t j = 0; j < n; j += 2) {
    // An odd last row pairs with zeros: adding 0 * 0 changes no sum (one from +0 is never -0).
    const bool pair = j + 1 < n;
    const float* x0 = &rows.values[j * kHeadDim];
    const float* x1 = pair ? x0 + kHeadDim : kZeroRow;
    for (int g = 0; g < kGroups; ++g) {
      double w[B][2];
      for (int h = 0; h < B; ++h) {
        w[h][0] = e[h * n + j] * rows.scales[j * kGroups + g];
        w[h][1] = pair ? e[h * n + j + 1] * rows.scales[(j + 1) * kGroups + g] : 0.0;
      }
      for (int d = g * kDsMlaGroup; d < (g + 1) * kDsMlaGroup; d += 8) {
        const D8 a = __builtin_convertvector(at8<F8>(x0 + d), D8);
        const D8 b = __builtin_convertvector(at8<F8>(x1 + d), D8);
        for (int h = 0; h < B; ++h) {
          D8& o = at8<D8>(out[h] + d);
          o = (o + w[h][0] * a) + w[h][1] * b;
        }
      }
    }
  }
}

// Turns a head's scores into exp(s - m), m their max, in place; returns m and their sum. With m
// -inf (float sums that overflowed) -inf scores weigh 0 and NaN ones NaN: where every score is
// -inf the sum is 0, no attended column, as on CUDA.
std::pair<double, double> exponentiate(double* s, int64_t n) {
  const double m = *std::max_element(s, s + n);
  const bool low = m == -std::numeric_limits<double>::infinity();
  double sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += s[j] = low ? (std::isnan(s[j]) ? s[j] : 0.0) : std::exp(s[j] - m);
  return {m, sum};
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
  for (int d = 0; d < kHeadDim; ++d) dst[d] = double_to_bf16(values[d]);
}

// pos(t) = seq_len[b] - q_len[b] + i for the i-th token of request b. The validated boundaries,
// read again, are kept inside [0, T] so that values another thread changed since cannot index
// past the rows.
std::vector<TokenRow> token_rows(const DecodeProblem& p, const DecodeArgs& a) {
  std::vector<TokenRow> rows(p.num_tokens);
  const TensorView& cum = a.cum_seq_lens_q;
  auto i32 = [](const TensorView& v, int64_t i) { return v.ptr<const int32_t>()[i * v.stride(0)]; };
  for (int64_t b = 0; b < p.num_requests; ++b) {
    const int64_t begin = std::clamp<int64_t>(cum.defined() ? i32(cum, b) : b, 0, p.num_tokens);
    const int64_t end =
        std::clamp<int64_t>(cum.defined() ? i32(cum, b + 1) : b + 1, begin, p.num_tokens);
    const int64_t first_pos = i32(a.seq_lens, b) - (end - begin);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = first_pos + (t - begin);
      rows[t] = {b, pos, std::min<int64_t>(pos + 1, p.window)};
    }
  }
  return rows;
}

// Writes head h's output, bmm2 * out / (sum + exp(sink - m)) (out: its rows weighted by
// exp(s - m), sum: those weights' sum; no sink term without sinks), and its lse m + log(sum).
// Sum 0 (no rows, or only -inf scores): zero output and lse -inf. A +inf sink takes all the
// weight: zero output, but the lse never includes it.
void store_head(const DecodeArgs& a, int64_t t, int h, double m, double sum, double* out) {
  const bool has_sink = a.sinks.defined();
  const float sink = has_sink ? a.sinks.ptr<const float>()[h * a.sinks.stride(0)] : 0.f;
  const bool none = sum == 0;
  const bool zero = none || (has_sink && sink == std::numeric_limits<float>::infinity());
  const double factor = zero ? 0.0 : a.bmm2_scale / (sum + (has_sink ? std::exp(sink - m) : 0.0));
  for (int d = 0; d < kHeadDim; ++d) out[d] = zero ? 0.0 : out[d] * factor;
  store_out(a, t, h, out);
  if (a.lse.defined())
    a.lse.ptr<float>()[t * a.lse.stride(0) + h * a.lse.stride(1)] =
        static_cast<float>(none ? -std::numeric_limits<double>::infinity() : m + std::log(sum));
}

// Heads h0..h0+B-1 of token t: the formula of SPEC §2 with the row list already masked.
// `e` holds B * rows.count doubles.
template <int B>
void attend(const Rows& rows, const DecodeArgs& a, int64_t t, int h0, double* e) {
  const int64_t n = rows.count;
  double out[B][kHeadDim] = {};
  std::pair<double, double> max_sum[B] = {};
  if (n > 0) {
    float q[B][kHeadDim];
    for (int h = 0; h < B; ++h) load_query(a, t, h0 + h, q[h]);
    scores(rows, q, a.bmm1_scale, e);
    for (int h = 0; h < B; ++h) max_sum[h] = exponentiate(e + h * n, n);
    weighted_sum(rows, e, out);
  }
  for (int h = 0; h < B; ++h) store_head(a, t, h0 + h, max_sum[h].first, max_sum[h].second, out[h]);
}

}  // namespace

// Work is split in (token, block of kHeadBlock heads) units, contiguous ranges of them a
// thread: a range gathers each of its tokens' rows once, and one token's heads still spread
// over several threads when there are fewer tokens than threads.
void decode(const DecodeProblem& p, const DecodeArgs& a) {
  const std::vector<TokenRow> token = token_rows(p, a);
  const Columns columns(p, a);
  const int blocks = (p.num_heads + kHeadBlock - 1) / kHeadBlock;
  parallel_ranges(p.num_tokens * blocks, [&](int64_t begin, int64_t end) {
    const IeeeDefaultMode ieee;  // as the GPU computes, whatever the caller's mode
    Rows rows;
    std::vector<double> e;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t t = unit / blocks;
      const int h0 = static_cast<int>(unit % blocks) * kHeadBlock;
      if (unit == begin || h0 == 0) {
        gather(p, columns, t, token[t], rows);
        e.resize(kHeadBlock * rows.count);
      }
      if (h0 + kHeadBlock <= p.num_heads) {
        attend<kHeadBlock>(rows, a, t, h0, e.data());
      } else {
        for (int h = h0; h < p.num_heads; ++h) attend<1>(rows, a, t, h, e.data());
      }
      if (h0 == 0) {
        const double zero[kHeadDim] = {};
        for (int h = p.num_heads; h < p.out_heads; ++h) store_out(a, t, h, zero);
      }
    }
  });
}

}  // namespace smla::cpu
