#include "oracle.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "cpu/parallel.h"

namespace smla::cli {
namespace {

// The storage formats, decoded from their definitions: bf16 is the upper half of an IEEE
// binary32; e4m3fn has bias 7, subnormals m * 2^-9 and no inf (the step has no NaN codes).
double from_bf16(const std::byte* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
double from_e4m3(std::byte code) {
  static const std::array<double, 256> values = [] {
    std::array<double, 256> v{};
    for (unsigned bits = 0; bits < 256; ++bits) {
      const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
      const double magnitude =
          exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
      v[bits] = bits & 0x80 ? -magnitude : magnitude;
    }
    return v;
  }();
  return values[static_cast<unsigned>(code)];
}

int32_t at(const TensorView& v, int64_t i, int64_t j = 0) {
  return v.ptr<int32_t>()[i * v.strides[0] + (v.ndim > 1 ? j * v.strides[1] : 0)];
}

// Row `slot` (page slot / block_size, row slot % block_size) of a pool, as 512 doubles.
std::vector<double> kv_row(const TensorView& pool, int64_t slot) {
  const int64_t block_size = pool.shape[1];
  const int64_t page = slot / block_size, i = slot % block_size;
  const auto* base = static_cast<const std::byte*>(pool.data);
  std::vector<double> row(kHeadDim);
  if (pool.dtype == DType::u8) {  // fp8_ds_mla: 576-B records, then 8-B scale records
    const std::byte* page_start = base + page * pool.strides[0];
    const std::byte* record = page_start + i * kDsMlaRecordBytes;
    const std::byte* scales = page_start + block_size * kDsMlaRecordBytes + i * kDsMlaScaleBytes;
    for (int d = 0; d < kNopeDim; ++d)
      row[d] = from_e4m3(record[d]) * std::ldexp(1.0, static_cast<int>(scales[d / 64]) - 127);
    for (int d = 0; d < kRopeDim; ++d) row[kNopeDim + d] = from_bf16(record + kNopeDim + 2 * d);
    return row;
  }
  const size_t elem = dtype_size(pool.dtype);
  const std::byte* p = base + (page * pool.strides[0] + i * pool.strides[1]) * elem;
  for (int d = 0; d < kHeadDim; ++d) row[d] = elem == 2 ? from_bf16(p + 2 * d) : from_e4m3(p[d]);
  return row;
}

// The rows token t of layer `layer` attends: its causal window, then its valid top-k.
std::vector<std::vector<double>> attended_rows(const StepInputs& in, const AttentionLayer& layer,
                                               int64_t t) {
  int64_t b = 0;
  while (at(in.metadata.cum_seq_lens_q, b + 1) <= t) ++b;
  const int64_t first = at(in.metadata.cum_seq_lens_q, b);
  const int64_t q_len = at(in.metadata.cum_seq_lens_q, b + 1) - first;
  const int64_t pos = at(in.metadata.seq_lens, b) - q_len + (t - first);
  std::vector<std::vector<double>> rows;
  const TensorView& swa_table = in.block_tables[layer.spec.swa_group];
  for (int64_t p = std::max<int64_t>(pos - layer.spec.window + 1, 0); p <= pos; ++p)
    rows.push_back(
        kv_row(layer.swa_kv_cache,
               int64_t{at(swa_table, b, p / kSwaBlockSize)} * kSwaBlockSize + p % kSwaBlockSize));
  if (layer.spec.compress_ratio == 0) return rows;
  const TensorView& topk = in.topk_indices.at(layer.spec.index_source);
  const TensorView& table = in.compressed_block_tables.at(layer.spec.kv_source);
  for (int64_t j = 0; j < topk.shape[1]; ++j) {
    const int64_t x = at(topk, t, j);
    if (x >= 0)
      rows.push_back(kv_row(layer.compressed_kv_cache,
                            int64_t{at(table, b, x / kCompressedBlockSize)} * kCompressedBlockSize +
                                x % kCompressedBlockSize));
  }
  return rows;
}

// SPEC §2 for (t, h) over `keys`, against the layer's output row.
CheckResult check_row(const AttentionLayer& layer, const TensorView& query, const TensorView& out,
                      int64_t t, int64_t h, const std::vector<std::vector<double>>& keys) {
  const auto* q = static_cast<const std::byte*>(query.data) +
                  (t * query.strides[0] + h * query.strides[1]) * dtype_size(query.dtype);
  std::vector<double> q_row(kHeadDim), scores;
  for (int d = 0; d < kHeadDim; ++d)
    q_row[d] = query.dtype == DType::bf16 ? from_bf16(q + 2 * d) : from_e4m3(q[d]);
  for (const auto& k : keys) {
    double dot = 0;
    for (int d = 0; d < kHeadDim; ++d) dot += q_row[d] * k[d];
    scores.push_back(layer.bmm1_scale * dot);
  }
  const double sink = layer.sinks.defined() ? layer.sinks.ptr<float>()[h]
                                            : -std::numeric_limits<double>::infinity();
  double m = sink;
  for (double s : scores) m = std::max(m, s);
  // m is +inf for a +inf sink and -inf for nothing attended and no sink: SPEC's output is 0.
  double denominator = 1;
  std::vector<double> want(kHeadDim, 0.0);
  if (std::isfinite(m)) {
    denominator = std::exp(sink - m);
    for (size_t j = 0; j < keys.size(); ++j) {
      const double p = std::exp(scores[j] - m);
      denominator += p;
      for (int d = 0; d < kHeadDim; ++d) want[d] += p * keys[j][d];
    }
  }
  const auto* got =
      static_cast<const std::byte*>(out.data) + (t * out.strides[0] + h * out.strides[1]) * 2;
  double error = 0, scale = 0;
  for (int d = 0; d < kHeadDim; ++d) {
    want[d] *= layer.bmm2_scale / denominator;
    // A NaN would compare false and drop out of the max: a value that is not finite counts as
    // an infinite error, which fails any tolerance.
    const double diff = std::abs(from_bf16(got + 2 * d) - want[d]);
    error = std::max(error, std::isfinite(diff) ? diff : std::numeric_limits<double>::infinity());
    scale = std::max(scale, std::abs(want[d]));
  }
  return {1, error, scale > 0 ? error / scale : error};
}

}  // namespace

std::vector<Row> sample_rows(const TensorView& query, int count, std::mt19937_64& rng) {
  const int64_t tokens = query.shape[0], heads = query.shape[1];
  std::vector<Row> rows;
  if (count >= tokens * heads) {  // every row, once
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h) rows.push_back({t, h});
    return rows;
  }
  // Floyd's sampling: `count` distinct row numbers of tokens * heads, without a table of them.
  const int64_t n = tokens * heads;
  std::unordered_set<int64_t> picked;
  for (int64_t j = n - count; j < n; ++j) {
    const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(j + 1));
    picked.insert(picked.contains(r) ? j : r);
  }
  for (int64_t r : picked) rows.push_back({r / heads, r % heads});
  std::sort(rows.begin(), rows.end());  // each token's attended rows are decoded once
  return rows;
}

CheckResult check_layer(const StepData& host, size_t index, const std::vector<Row>& rows) {
  const AttentionLayer& layer = host.layers[index];
  const TensorView &query = host.queries[index], &out = host.outs[index];
  std::vector<size_t> first;  // each token's first row, then the end
  for (size_t i = 0; i < rows.size(); ++i)
    if (i == 0 || rows[i - 1].token != rows[i].token) first.push_back(i);
  first.push_back(rows.size());
  const int64_t tokens = static_cast<int64_t>(first.size()) - 1;
  // Over the CPU backend's threads, a token at a time each: a token's rows are decoded once, and
  // the threads at work hold at most kKeyBytes of them (4 KiB a row; 34 MiB at 1M tokens of
  // context), which the host limit of the step leaves room for.
  constexpr int64_t kKeyBytes = int64_t(1) << 30;
  const int64_t widest =
      layer.spec.window + (layer.spec.compress_ratio > 0
                               ? host.inputs.topk_indices.at(layer.spec.index_source).shape[1]
                               : 0);
  const int64_t parts = std::min(
      tokens, std::max<int64_t>(1, kKeyBytes / (widest * kHeadDim * int64_t(sizeof(double)))));
  CheckResult result;
  std::mutex merging;
  cpu::parallel_ranges(parts, [&](int64_t begin, int64_t end) {
    CheckResult part;
    for (int64_t k = begin * tokens / parts; k < end * tokens / parts; ++k) {
      const std::vector<std::vector<double>> keys =
          attended_rows(host.inputs, layer, rows[first[k]].token);
      for (size_t i = first[k]; i < first[k + 1]; ++i)
        merge(part, check_row(layer, query, out, rows[i].token, rows[i].head, keys));
    }
    const std::lock_guard lock(merging);
    merge(result, part);
  });
  return result;
}

void merge(CheckResult& into, const CheckResult& more) {
  into.rows += more.rows;
  into.max_error = std::max(into.max_error, more.max_error);
  into.max_relative_error = std::max(into.max_relative_error, more.max_relative_error);
}

}  // namespace smla::cli
