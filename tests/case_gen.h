// Random decode cases for SPEC §2: fresh inputs for every check, every pool layout (packed pages
// included) and every masking rule; the seed and choices are in DecodeCase::summary.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host_case.h"
#include "ref_numeric.h"
#include "seed.h"

namespace smla::test {

enum class SinkKind { absent, neg_inf, finite, pos_inf, mixed };
// compressed_kv_cache: absent (columns >= W read the SWA pool), an equal copy of the SWA pool,
// or a pool of its own with its own geometry.
enum class PoolSharing { random, absent, same, separate };

struct CaseSpec {
  KvLayout layout = KvLayout::bf16;
  DType query_dtype = DType::bf16;  // f8e4m3 only with layout fp8_e4m3
  int heads = 8;
  int out_heads = 0;        // 0: heads
  std::vector<int> q_lens;  // per request; empty: `requests` requests of 1..max_q tokens (or 0)
  int requests = 3;
  int max_q = 6;
  bool varlen = true;  // false: no cum_seq_lens_q, every q_len is 1
  int window = kWindow;
  int compressed_width = 64;  // P: K = window + P
  SinkKind sinks = SinkKind::mixed;
  bool lse = true;
  PoolSharing pools = PoolSharing::random;
  bool extremes = false;    // fp8: every e4m3 code; UE8M0 exponents 107..147 and extremes
  // The largest extreme exponent: the float64 oracle takes 240 (values near 2^121), a kernel
  // that sums P.V in float32 needs 448 * 2^(e-127) * K * 2^32 below 2^128.
  int top_exponent = 240;
  // fp8_ds_mla: UE8M0 exponents drawn from these alone (empty: as `extremes` says).
  std::vector<uint8_t> scale_exponents;
  // Scores this many times their usual O(1) spread: a row's max then rises past the kernel's
  // rescale threshold (15-32 log2 units) from tile to tile.
  double score_spread = 1;
  // e4m3 cache rows (fp8_e4m3) of integers in [-7, 7] and an e4m3 query of -1, 0 and 1: every
  // score is then an integer below 2^13, which e4m3 wgmma (sums of about 14 bits) get exactly.
  // Their error otherwise grows with a score's size: 0.24 nats at 189 (score_spread 40).
  bool integer_fp8 = false;
  double masked = 0.15;     // chance of a padding / past-the-pool / packed-slot offset
  bool all_masked = false;  // no token attends any row
  // all_masked: an inf or a NaN in each token's query, whose empty row is still 0 on the CPU
  // (CUDA gives NaN there: docs/decode.md, "Value checks").
  bool nonfinite_query = false;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen_); }
  double normal() { return std::normal_distribution<double>()(gen_); }
  bool chance(double p) { return real(0, 1) < p; }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// A generated pool: row p * span + s lives in page p, slot s, and is a real row when
// s < block_size; the other slots and the page tails are filled with NaN bytes.
struct PoolShape {
  KvLayout layout = KvLayout::bf16;
  int64_t num_blocks = 2, block_size = 16;
  int64_t packed = 0;     // bf16/fp8_e4m3: extra token rows per page; fp8_ds_mla: extra 576-B units
  int64_t token_pad = 0;  // bf16/fp8_e4m3: extra elements between token rows
  bool rank4 = false;     // [blocks, block_size, 1, row]

  int64_t span() const { return layout == KvLayout::fp8_ds_mla ? block_size : block_size + packed; }
  int64_t rows() const { return num_blocks * span(); }
  int64_t page_bytes() const {  // fp8_ds_mla
    const int64_t unit = kDsMlaRecordBytes;
    return (block_size * (kDsMlaRecordBytes + kDsMlaScaleBytes) + unit - 1) / unit * unit +
           packed * unit;
  }
  std::string describe() const {
    return std::string(kv_layout_name(layout)) + "{blocks=" + std::to_string(num_blocks) +
           " block_size=" + std::to_string(block_size) + " span=" + std::to_string(span()) +
           " packed=" + std::to_string(packed) + " token_pad=" + std::to_string(token_pad) +
           (rank4 ? " rank4}" : "}");
  }
};

inline PoolShape random_pool_shape(Rng& rng, KvLayout layout) {
  PoolShape s;
  s.layout = layout;
  s.block_size = int64_t{16} << rng.uniform(0, 2);
  s.num_blocks = rng.uniform(2, 5);
  s.packed = rng.chance(0.5) ? rng.uniform(1, s.block_size) : 0;
  if (layout == KvLayout::fp8_ds_mla) s.packed = rng.uniform(0, 2);
  s.token_pad = layout != KvLayout::fp8_ds_mla && rng.chance(0.25) ? 64 : 0;
  s.rank4 = rng.chance(0.5);
  return s;
}

// A finite e4m3 code: moderate magnitudes (1/8..7.5), any of the 254 finite codes (extremes),
// or an integer in [-integers, integers] (integers 1..15).
inline uint8_t e4m3_code(Rng& rng, bool extremes, int integers = 0) {
  if (integers) {
    const int n = static_cast<int>(rng.uniform(-integers, integers)), a = std::abs(n);
    if (!a) return 0;
    const int e = std::bit_width(static_cast<unsigned>(a)) - 1;  // a = (8 + m) 2^e / 8
    return static_cast<uint8_t>((n < 0) << 7 | (e + 7) << 3 | ((a << 3 >> e) & 7));
  }
  if (extremes) {
    const int u = static_cast<int>(rng.uniform(0, 253));
    return static_cast<uint8_t>(u < 0x7f ? u : u + 1);  // skips the NaNs 0x7F and 0xFF
  }
  return static_cast<uint8_t>((rng.uniform(0, 1) << 7) | (rng.uniform(4, 9) << 3) |
                              rng.uniform(0, 7));
}

// UE8M0 exponents for `count` scale slots: 127 +- 3, any of spec.scale_exponents, or
// (extremes) every exponent of 127 +- 20 plus extreme ones up to spec.top_exponent (values stay
// finite in float and bf16), shuffled.
inline std::vector<uint8_t> scale_exponents(Rng& rng, int64_t count, const CaseSpec& spec) {
  std::vector<uint8_t> e(count);
  const std::vector<uint8_t>& from = spec.scale_exponents;
  if (!from.empty()) {
    for (auto& x : e) x = from[rng.uniform(0, int64_t(from.size()) - 1)];
    return e;
  }
  if (!spec.extremes) {
    for (auto& x : e) x = static_cast<uint8_t>(127 + rng.uniform(-3, 3));
    return e;
  }
  const int top = spec.top_exponent;
  std::vector<uint8_t> all = {0, 1, 2, static_cast<uint8_t>(top - 10), static_cast<uint8_t>(top)};
  for (int x = 107; x <= 147; ++x) all.push_back(static_cast<uint8_t>(x));
  for (int64_t i = 0; i < count; ++i) e[i] = all[i % all.size()];
  std::shuffle(e.begin(), e.end(), rng.engine());
  return e;
}

// Mean square of the values a generator wrote, to pick a bmm1_scale that keeps scores O(1).
struct Moments {
  double sum_squares = 0;
  int64_t count = 0;
  void add(double x) { sum_squares += x * x, ++count; }
  double rms() const { return count && sum_squares > 0 ? std::sqrt(sum_squares / count) : 1.0; }
};

// A pool of `s`'s shape whose values `spec` describes (extremes, scale_exponents, integer_fp8).
inline HostTensor make_pool(const PoolShape& s, Rng& rng, const CaseSpec& spec, Moments& moments) {
  const bool extremes = spec.extremes;
  const int e4m3_integers = spec.integer_fp8 ? 7 : 0;
  const bool ds = s.layout == KvLayout::fp8_ds_mla;
  const int64_t row = ds ? kDsMlaRecordBytes + kDsMlaScaleBytes : kHeadDim;
  const int64_t token = ds ? row : kHeadDim + s.token_pad;
  const int64_t block = ds ? s.page_bytes() : s.span() * token;
  const DType dtype = ds ? DType::u8 : s.layout == KvLayout::bf16 ? DType::bf16 : DType::f8e4m3;
  HostTensor t =
      s.rank4
          ? HostTensor::make(dtype, {s.num_blocks, s.block_size, 1, row}, {block, token, token, 1})
          : HostTensor::make(dtype, {s.num_blocks, s.block_size, row}, {block, token, 1});
  // The bytes past the last page's real rows are part of its page (packed data of others).
  t.bytes.resize(s.num_blocks * block * dtype_size(dtype));
  std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0xff});  // NaN in every format
  const std::vector<uint8_t> exps =
      ds ? scale_exponents(rng, s.num_blocks * s.block_size * 7, spec) : std::vector<uint8_t>{};
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t p = 0; p < s.num_blocks; ++p) {
    for (int64_t i = 0; i < s.block_size; ++i) {
      if (!ds) {
        const int64_t at = (p * block + i * token) * elem;
        for (int d = 0; d < kHeadDim; ++d) {
          if (s.layout == KvLayout::bf16) {
            const uint16_t bits = to_bf16(rng.normal());
            t.store(at + 2 * d, bits);
            moments.add(ref_bf16(bits));
          } else {
            const uint8_t code = e4m3_code(rng, extremes, e4m3_integers);
            t.store(at + d, code);
            moments.add(ref_e4m3(code));
          }
        }
        continue;
      }
      const int64_t rec = p * block + i * kDsMlaRecordBytes;
      const int64_t scales = p * block + s.block_size * kDsMlaRecordBytes + i * kDsMlaScaleBytes;
      for (int g = 0; g < 7; ++g) {
        const uint8_t e = exps[(p * s.block_size + i) * 7 + g];
        t.store(scales + g, e);
        for (int d = g * 64; d < (g + 1) * 64; ++d) {
          const uint8_t code = e4m3_code(rng, extremes);
          t.store(rec + d, code);
          moments.add(ref_e4m3(code) * ref_ue8m0(e));
        }
      }
      for (int d = 0; d < kRopeDim; ++d) {
        const uint16_t bits = to_bf16(rng.normal());
        t.store(rec + kNopeDim + 2 * d, bits);
        moments.add(ref_bf16(bits));
      }
    }
  }
  return t;
}

inline int32_t valid_offset(Rng& rng, const PoolShape& s) {
  return static_cast<int32_t>(rng.uniform(0, s.num_blocks - 1) * s.span() +
                              rng.uniform(0, s.block_size - 1));
}

// An offset that rule 3 masks: padding, any negative, past the pool, or a packed slot.
inline int32_t masked_offset(Rng& rng, const PoolShape& s) {
  switch (rng.uniform(0, 4)) {
    case 0: return -1;
    case 1:
      return rng.chance(0.5) ? std::numeric_limits<int32_t>::min()
                             : static_cast<int32_t>(-rng.uniform(2, 1000));
    case 2: return static_cast<int32_t>(s.rows() + rng.uniform(0, 100));
    case 3: return std::numeric_limits<int32_t>::max();
    default:
      if (s.span() == s.block_size) return -1;
      return static_cast<int32_t>(rng.uniform(0, s.num_blocks - 1) * s.span() +
                                  rng.uniform(s.block_size, s.span() - 1));
  }
}

inline std::string join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

namespace detail {

// One token's row of sparse_indices and its length.
inline int32_t fill_row(Rng& rng, const CaseSpec& spec, const PoolShape& swa,
                        const PoolShape& compressed, int64_t swa_len, int32_t* row) {
  const int64_t W = spec.window, K = W + spec.compressed_width;
  auto column = [&](int64_t c, bool masked) {
    return masked ? masked_offset(rng, c < W ? swa : compressed)
                  : valid_offset(rng, c < W ? swa : compressed);
  };
  if (spec.all_masked) {
    // Nothing attended: by length (rule 1), by the causal window (rule 2) or by offsets (3).
    const int64_t mode = swa_len < W ? rng.uniform(0, 2) : rng.uniform(0, 1);
    for (int64_t c = 0; c < K; ++c) row[c] = column(c, mode == 1 || (mode == 2 && c < swa_len));
    return static_cast<int32_t>(mode == 0 ? 0 : mode == 1 ? K : W);
  }
  for (int64_t c = 0; c < K; ++c) {
    const bool duplicate = c > 0 && row[c - 1] >= 0 && (c < W) == (c - 1 < W) && rng.chance(0.1);
    row[c] = duplicate ? row[c - 1] : column(c, rng.chance(spec.masked));
  }
  const double r = rng.real(0, 1);
  return static_cast<int32_t>(r < 0.05   ? 0
                              : r < 0.3  ? rng.uniform(0, K)
                              : r < 0.45 ? K
                                         : rng.uniform(W, K));
}

inline float sink_value(Rng& rng, SinkKind kind) {
  switch (kind) {
    case SinkKind::neg_inf: return -std::numeric_limits<float>::infinity();
    case SinkKind::pos_inf: return std::numeric_limits<float>::infinity();
    case SinkKind::finite: return static_cast<float>(rng.real(-2, 8));
    default: {
      const double r = rng.real(0, 1);
      return sink_value(rng, r < 0.2   ? SinkKind::neg_inf
                             : r < 0.3 ? SinkKind::pos_inf
                                       : SinkKind::finite);
    }
  }
}

}  // namespace detail

inline DecodeCase make_case(const CaseSpec& spec, uint64_t seed) {
  Rng rng(seed);
  DecodeCase c;
  c.seed = seed;
  c.window = spec.window;
  const int H = spec.heads, H_out = spec.out_heads ? spec.out_heads : spec.heads;
  const int64_t W = spec.window, K = W + spec.compressed_width;

  std::vector<int> q_lens = spec.q_lens, seq_lens;
  if (q_lens.empty())  // varlen: a request past the first has no tokens one time in ten
    for (int b = 0; b < spec.requests; ++b)
      q_lens.push_back(!spec.varlen               ? 1
                       : b > 0 && rng.chance(0.1) ? 0
                                                  : static_cast<int>(rng.uniform(1, spec.max_q)));
  const int64_t B = static_cast<int64_t>(q_lens.size());
  for (int q : q_lens) {  // below, around and above the window
    const double r = rng.real(0, 1);
    const int64_t extra = r < 0.3   ? rng.uniform(0, W / 2)
                          : r < 0.5 ? rng.uniform(W - 3, W + 3)
                                    : rng.uniform(W, 4 * W);
    seq_lens.push_back(static_cast<int>(q + std::max<int64_t>(extra, 0)));
  }
  int64_t T = 0;
  for (int q : q_lens) T += q;
  c.max_q_len =
      *std::max_element(q_lens.begin(), q_lens.end()) + static_cast<int>(rng.uniform(0, 1));

  Moments kv, qm;
  const PoolShape swa = random_pool_shape(rng, spec.layout);
  PoolShape compressed = swa;
  c.swa_kv_cache = make_pool(swa, rng, spec, kv);
  const PoolSharing sharing =
      spec.pools != PoolSharing::random ? spec.pools : static_cast<PoolSharing>(rng.uniform(1, 3));
  if (sharing == PoolSharing::same) c.compressed_kv_cache = c.swa_kv_cache;
  if (sharing == PoolSharing::separate) {
    compressed = random_pool_shape(rng, spec.layout);
    c.compressed_kv_cache = make_pool(compressed, rng, spec, kv);
  }

  const int64_t q_token_stride = H * kHeadDim + (rng.chance(0.3) ? kHeadDim : 0);
  c.query = HostTensor::make(spec.query_dtype, {T, H, kHeadDim}, {q_token_stride, kHeadDim, 1});
  std::fill(c.query.bytes.begin(), c.query.bytes.end(), std::byte{0xff});  // NaN in the gaps
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = t * q_token_stride; i < t * q_token_stride + H * kHeadDim; ++i) {
      if (spec.query_dtype == DType::bf16) {
        const uint16_t bits = to_bf16(rng.normal());
        c.query.set(i, bits);
        qm.add(ref_bf16(bits));
      } else {
        const uint8_t code = e4m3_code(rng, spec.extremes, spec.integer_fp8 ? 1 : 0);
        c.query.set(i, code);
        qm.add(ref_e4m3(code));
      }
    }
  if (spec.all_masked && spec.nonfinite_query)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = t * q_token_stride + rng.uniform(0, H * kHeadDim - 1);
      const uint16_t bf16_bits[] = {0x7f80, 0xff80, 0x7fc0};  // +inf, -inf, NaN
      if (spec.query_dtype == DType::bf16)
        c.query.set(at, bf16_bits[rng.uniform(0, 2)]);
      else
        c.query.set(at, static_cast<uint8_t>(rng.chance(0.5) ? 0x7f : 0xff));  // e4m3 NaNs
    }

  c.seq_lens = HostTensor::make(DType::i32, {B});
  if (spec.varlen) c.cum_seq_lens_q = HostTensor::make(DType::i32, {B + 1});
  c.sparse_indices = HostTensor::make(DType::i32, {T, K});
  c.sparse_topk_lens = HostTensor::make(DType::i32, {T});
  std::vector<int32_t> row(K);
  for (int64_t b = 0, t = 0; b < B; ++b) {
    c.seq_lens.set<int32_t>(b, seq_lens[b]);
    if (spec.varlen) c.cum_seq_lens_q.set<int32_t>(b, static_cast<int32_t>(t));
    for (int i = 0; i < q_lens[b]; ++i, ++t) {
      const int64_t pos = seq_lens[b] - q_lens[b] + i;
      const int32_t len =
          detail::fill_row(rng, spec, swa, compressed, std::min(pos + 1, W), row.data());
      c.sparse_topk_lens.set<int32_t>(t, len);
      for (int64_t col = 0; col < K; ++col) c.sparse_indices.set<int32_t>(t * K + col, row[col]);
    }
  }
  if (spec.varlen) c.cum_seq_lens_q.set<int32_t>(B, static_cast<int32_t>(T));

  if (spec.sinks != SinkKind::absent) {
    c.sinks = HostTensor::make(DType::f32, {H});
    for (int h = 0; h < H; ++h) c.sinks.set<float>(h, detail::sink_value(rng, spec.sinks));
  }
  c.out = HostTensor::make(DType::bf16, {T, H_out, kHeadDim});
  if (spec.lse) c.lse = HostTensor::make(DType::f32, {T, H});
  poison_outputs(c);
  c.bmm1_scale = static_cast<float>(spec.score_spread * rng.real(0.5, 3) /
                                    (qm.rms() * kv.rms() * std::sqrt(kHeadDim)));
  c.bmm2_scale = static_cast<float>(rng.real(0.5, 2));

  const char* sharing_names[] = {"random", "absent", "same", "separate"};
  const char* sink_names[] = {"absent", "-inf", "finite", "+inf", "mixed"};
  const auto real = [](float x) {  // %g: the extremes' small scales are not 0.000000
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return std::string(text);
  };
  const std::string exponents =
      spec.scale_exponents.empty()
          ? ""
          : " scale_exponents=" + join({spec.scale_exponents.begin(), spec.scale_exponents.end()});
  c.summary = seed_note(seed) + " query=" + dtype_name(spec.query_dtype) +
              " H=" + std::to_string(H) + " H_out=" + std::to_string(H_out) +
              " T=" + std::to_string(T) + " q_lens=" + join(q_lens) +
              " seq_lens=" + join(seq_lens) + (spec.varlen ? "" : " (no cum_seq_lens_q)") +
              " W=" + std::to_string(W) + " K=" + std::to_string(K) + " swa=" + swa.describe() +
              " compressed=" + sharing_names[static_cast<int>(sharing)] +
              (sharing == PoolSharing::separate ? compressed.describe() : "") +
              " sinks=" + sink_names[static_cast<int>(spec.sinks)] + (spec.lse ? " lse" : "") +
              (spec.extremes ? " extremes" : "") + (spec.integer_fp8 ? " integer_fp8" : "") +
              exponents + (spec.all_masked ? " all_masked" : "") +
              (spec.all_masked && spec.nonfinite_query ? " nonfinite_query" : "") +
              " bmm1=" + real(c.bmm1_scale) + " bmm2=" + real(c.bmm2_scale);
  return c;
}

}  // namespace smla::test
