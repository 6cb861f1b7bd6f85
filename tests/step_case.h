// A random decode step in host memory for the index, table and executor tests: request
// lengths, the SWA groups' block tables, each layer's pools, each kv source's compressed pool
// and block table, and each index source's local top-k.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <list>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "case_gen.h"
#include "core/numeric.h"
#include "smla/executor.h"
#include "smla/model.h"
#include "smla/quantize.h"

namespace smla::test {

struct CaseShape {
  std::vector<int> q_lens;    // per request; decode requests first
  std::vector<int> seq_lens;  // per request, >= q_len
  int num_decodes = 0;
  int num_groups = 1;        // block tables made for groups 0..num_groups-1
  int block_size = 16;       // SWA page rows
  int span = 16;             // SWA page stride in rows (> block_size: packed)
  int entries_per_page = 8;  // E: compressed page rows
  int compressed_span = 8;
  double invalid_fraction = 0.0;      // share of padding tokens (is_valid_token = 0)
  int decode_swa_width = 0;           // > window: DSpark
  bool evict_outside_window = false;  // SWA pages wholly before every window are -1
  int window = kWindow;               // that window (give the layers the same)
  // Top-k entries past the (pos + 1) / ratio a token sees hold random entries of the request
  // (in range, >= 0) instead of -1: SPEC §4 takes a prefill row's first min((pos + 1) / ratio,
  // top_k) entries as they are, whatever follows them, and every valid entry of a decode row
  // (valid ones first), so the rules then differ and num_decodes decides which applies.
  bool topk_tails = false;
  // Every pool's layout: random bf16 rows quantized into it (quantize_kv, kv_scale 1). An
  // fp8_ds_mla page's span - block_size extra slots are extra 576-B units; every byte no row's
  // record or scales take is 0xff (e4m3 NaN codes under the scale 2^128).
  KvLayout layout = KvLayout::bf16;
};

// Each cache layout with the query dtypes it takes (an e4m3 query only with an e4m3 cache).
struct LayoutKind {
  KvLayout layout;
  DType query;
};
inline constexpr LayoutKind kLayoutKinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3},
                                              {KvLayout::fp8_e4m3, DType::bf16}};

// One SWA-only, one dense (every entry) and one indexed compressed layer: each kind of table.
inline std::vector<LayerSpec> three_layers(int ratio, int window = kWindow) {
  return {{.layer = 0, .num_heads = 1, .window = window},
          {.layer = 1,
           .compress_ratio = 128,
           .kv_source = 1,
           .index_source = 1,
           .num_heads = 1,
           .window = window},
          {.layer = 2,
           .compress_ratio = ratio,
           .kv_source = 2,
           .index_source = 2,
           .index_topk = 30,
           .num_heads = 1,
           .window = window}};
}

// A random step of decode and prefill requests (trial % 3 == 0: with padding tokens; odd
// trials: SWA pages before every window evicted; a request, the first too, has no tokens one
// time in ten, the step one token at least), on packed pages of random sizes.
inline CaseShape random_shape(std::mt19937& rng, int trial) {
  std::uniform_int_distribution<int> requests(1, 6), q_len(1, 5), prefill_len(1, 90), extra(0, 700),
      block_size(1, 40), pack(0, 3), entries(1, 12);
  std::bernoulli_distribution empty(0.1);
  CaseShape s;
  const int B = requests(rng);
  s.num_decodes = std::uniform_int_distribution<int>(0, B)(rng);
  for (int b = 0; b < B; ++b) {
    s.q_lens.push_back(empty(rng) ? 0 : b < s.num_decodes ? q_len(rng) : prefill_len(rng));
    s.seq_lens.push_back(s.q_lens.back() + extra(rng));
  }
  if (std::accumulate(s.q_lens.begin(), s.q_lens.end(), 0) == 0)
    ++s.q_lens.back(), ++s.seq_lens.back();
  s.block_size = block_size(rng);
  s.span = s.block_size + pack(rng);
  s.entries_per_page = entries(rng);
  s.compressed_span = s.entries_per_page + pack(rng);
  s.invalid_fraction = trial % 3 == 0 ? 0.2 : 0.0;
  s.evict_outside_window = trial % 2 == 1;
  s.topk_tails = trial % 4 < 2;
  return s;
}

// A random DSpark step: draft blocks of up to 70 tokens (odd trials: packed pages and padding).
inline CaseShape random_dspark_shape(std::mt19937& rng, int trial) {
  CaseShape s;
  const int draft = std::uniform_int_distribution<int>(1, 70)(rng);
  s.decode_swa_width = dspark_swa_width(kWindow, draft);
  const int B = std::uniform_int_distribution<int>(1, 5)(rng);
  s.num_decodes = B;
  for (int b = 0; b < B; ++b) {
    s.q_lens.push_back(std::uniform_int_distribution<int>(1, draft)(rng));
    s.seq_lens.push_back(s.q_lens.back() + std::uniform_int_distribution<int>(0, 400)(rng));
  }
  s.block_size = std::uniform_int_distribution<int>(1, 64)(rng);
  s.span = s.block_size + trial % 2;
  s.invalid_fraction = trial % 2 ? 0.25 : 0.0;
  return s;
}

class StepCase {
 public:
  StepCase(const std::vector<LayerSpec>& specs, const CaseShape& shape, uint64_t seed)
      : shape_(shape), rng_(seed) {
    const int B = static_cast<int>(shape.q_lens.size());
    std::vector<int32_t> cum{0};
    for (int q : shape.q_lens) cum.push_back(cum.back() + q);
    T_ = cum.back();
    StepMetadata& m = inputs.metadata;
    m.num_tokens = T_;
    m.seq_lens = keep(std::vector<int32_t>(shape.seq_lens.begin(), shape.seq_lens.end()), {B});
    m.cum_seq_lens_q = keep(cum, {B + 1});
    m.num_decodes = shape.num_decodes;
    m.max_q_len = std::max(1, *std::max_element(shape.q_lens.begin(), shape.q_lens.end()));
    m.decode_swa_width = shape.decode_swa_width;
    if (shape.invalid_fraction > 0) {
      std::vector<uint8_t> valid(T_);
      std::bernoulli_distribution invalid(shape.invalid_fraction);
      for (auto& v : valid) v = !invalid(rng_);
      valid_ = valid;
      // Every other case reads the mask at stride 2, the bytes between saying the opposite.
      const int64_t stride = 1 + int64_t(rng_() % 2);
      std::vector<uint8_t> bytes(T_ * stride);
      for (int t = 0; t < T_; ++t)
        for (int64_t k = 0; k < stride; ++k) bytes[t * stride + k] = k ? !valid[t] : valid[t];
      m.is_valid_token = keep_u8(std::move(bytes), {T_}, {stride});
    }
    for (int t = 0; t < T_; ++t) {
      const int b = static_cast<int>(std::upper_bound(cum.begin(), cum.end(), t) - cum.begin()) - 1;
      request_.push_back(b);
      pos_.push_back(shape.seq_lens[b] - shape.q_lens[b] + (t - cum[b]));
    }
    const int max_seq = *std::max_element(shape.seq_lens.begin(), shape.seq_lens.end());
    swa_pages_ = (max_seq + shape.block_size - 1) / shape.block_size;
    for (int g = 0; g < shape.num_groups; ++g) inputs.block_tables.push_back(swa_block_table());
    for (const LayerSpec& s : specs) {
      AttentionLayer layer{.spec = s,
                           .swa_kv_cache = pool(B * swa_pages_, shape.block_size, shape.span)};
      // Scores of about unit spread, so each row's softmax weighs its columns unevenly: the
      // values' rms is about 1/3 (random_bf16), so a product's is 1/9. Each layer's scales its
      // own, so a layer run with another's shows.
      const float own = 1.0f + static_cast<float>(layers.size() % 8) / 8.0f;
      layer.bmm1_scale = own * 9.0f / std::sqrt(static_cast<float>(kHeadDim));
      layer.bmm2_scale = 2.0f - own / 2.0f;
      if (s.compress_ratio > 0) {
        if (!compressed_pools_.contains(s.kv_source)) add_kv_source(s, max_seq);
        layer.compressed_kv_cache = compressed_pools_.at(s.kv_source);
        if (!inputs.topk_indices.contains(s.index_source)) add_index_source(s, max_seq);
      }
      layers.push_back(layer);
    }
  }

  int64_t num_tokens() const { return T_; }
  int request(int t) const { return request_[t]; }
  int pos(int t) const { return pos_[t]; }
  bool valid(int t) const { return valid_.empty() || valid_[t]; }

  // -1 or -7 in every top-k: in a random fifth of the prefill tokens' entries, wherever they are
  // in the row, and in a third of the decode tokens' rows from a random entry on (a decode row's
  // valid entries come first, SPEC §4).
  void punch_topk_holes() {
    const int64_t decode_tokens = std::accumulate(
        shape_.q_lens.begin(), shape_.q_lens.begin() + shape_.num_decodes, int64_t{0});
    std::bernoulli_distribution hole(0.2), cut(1.0 / 3), minus_one(0.5);
    for (auto& [layer, topk] : inputs.topk_indices) {
      int32_t* x = topk.ptr<int32_t>();
      const int64_t width = topk.size(1);
      for (int64_t t = 0; width > 0 && t < topk.size(0); ++t) {
        const bool decode = t < decode_tokens;
        if (decode && !cut(rng_)) continue;
        for (int64_t j = decode ? int64_t(rng_() % width) : 0; j < width; ++j)
          if (decode || hole(rng_)) x[t * width + j] = minus_one(rng_) ? -1 : -7;
      }
    }
  }

  // The build arguments of `layer`'s table, outputs unset (what StepExecutor passes).
  SparseIndexArgs args(int layer) const {
    const AttentionLayer& l = layers.at(index_of(layer));
    SparseIndexArgs a;
    a.step = inputs.metadata;
    a.window = l.spec.window;
    a.swa = {inputs.block_tables.at(l.spec.swa_group), l.swa_kv_cache};
    if (l.spec.compress_ratio > 0)
      a.compressed = {l.spec.compress_ratio, inputs.topk_indices.at(l.spec.index_source),
                      inputs.compressed_block_tables.at(l.spec.kv_source), l.compressed_kv_cache};
    return a;
  }

  // A random bf16 tensor [rows, heads, 512].
  TensorView bf16(int64_t rows, int64_t heads) {
    u16_.push_back(random_bf16(rows * heads * kHeadDim));
    return make_view(u16_.back().data(), DType::bf16, Device{}, {rows, heads, kHeadDim});
  }

  // A random query [rows, heads, 512] of `dtype`: bf16, or f8e4m3 (bf16 values rounded to e4m3).
  TensorView query(int64_t rows, int64_t heads, DType dtype) {
    if (dtype == DType::bf16) return bf16(rows, heads);
    const TensorView values = bf16(rows, heads);
    const TensorView q = zeros(DType::f8e4m3, {rows, heads, kHeadDim});
    for (int64_t i = 0; i < q.numel(); ++i)
      q.ptr<uint8_t>()[i] = float_to_e4m3(bf16_to_float(values.ptr<const uint16_t>()[i]));
    return q;
  }

  // Zeroed host storage viewed as `dtype` with this shape.
  TensorView zeros(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    bytes_.emplace_back(n * dtype_size(dtype));
    return make_view(bytes_.back().data(), dtype, Device{}, shape);
  }

  // A pool of `like`'s geometry (a [blocks, block_size, 512] bf16 pool, its strides too) whose
  // every element is a NaN: what no attended column may read.
  TensorView nan_pool(const TensorView& like) {
    if (like.dtype != DType::bf16) throw std::invalid_argument("nan_pool: a bf16 pool");
    u16_.emplace_back(like.size(0) * like.stride(0), uint16_t{0x7fc0});
    return make_view(u16_.back().data(), DType::bf16, Device{},
                     {like.size(0), like.size(1), like.size(2)},
                     {like.stride(0), like.stride(1), like.stride(2)});
  }

  TensorView keep(std::vector<int32_t> data, std::initializer_list<int64_t> shape) {
    i32_.push_back(std::move(data));
    return make_view(i32_.back().data(), DType::i32, Device{}, shape);
  }

  StepInputs inputs;
  std::vector<AttentionLayer> layers;

 private:
  size_t index_of(int layer) const {
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i].spec.layer == layer) return i;
    throw std::out_of_range("layer");
  }

  TensorView keep_u8(std::vector<uint8_t> data, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides) {
    u8_.push_back(std::move(data));
    return make_view(u8_.back().data(), DType::u8, Device{}, shape, strides);
  }

  // bf16 values of magnitude in [2^-7, 1) and random sign, four from each draw.
  std::vector<uint16_t> random_bf16(int64_t n) {
    std::vector<uint16_t> data(n);
    for (int64_t i = 0; i < n; i += 4) {
      uint64_t bits = rng_();
      for (int64_t j = i; j < std::min(i + 4, n); ++j, bits >>= 16) {
        const uint16_t exponent = 120 + (bits >> 7) % 7;  // 2^-7 .. 2^-1
        data[j] = static_cast<uint16_t>((bits & 0x8000) | (exponent << 7) | (bits & 0x7f));
      }
    }
    return data;
  }

  // [blocks, block_size, row] in shape_.layout with a page stride of `span` rows (CaseShape).
  TensorView pool(int64_t blocks, int64_t block_size, int64_t span) {
    u16_.push_back(random_bf16(blocks * span * kHeadDim));
    uint16_t* values = u16_.back().data();
    if (shape_.layout == KvLayout::bf16)
      return make_view(values, DType::bf16, Device{}, {blocks, block_size, kHeadDim},
                       {span * kHeadDim, kHeadDim, 1});
    TensorView pool;
    if (shape_.layout == KvLayout::fp8_e4m3) {
      bytes_.emplace_back(blocks * span * kHeadDim, std::byte{0xff});
      pool = make_view(bytes_.back().data(), DType::f8e4m3, Device{},
                       {blocks, block_size, kHeadDim}, {span * kHeadDim, kHeadDim, 1});
    } else {
      constexpr int64_t kRow = kDsMlaRecordBytes + kDsMlaScaleBytes;
      const int64_t page =
          PoolShape{
              .layout = KvLayout::fp8_ds_mla, .block_size = block_size, .packed = span - block_size}
              .page_bytes();
      bytes_.emplace_back(blocks * page, std::byte{0xff});
      pool = make_view(bytes_.back().data(), DType::u8, Device{}, {blocks, block_size, kRow},
                       {page, kRow, 1});
    }
    const int64_t n = blocks * block_size;
    u16_.emplace_back(n * kHeadDim);
    std::vector<int32_t> slots(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = i / block_size * span + i % block_size;
      std::copy_n(values + row * kHeadDim, kHeadDim, u16_.back().data() + i * kHeadDim);
      slots[i] = static_cast<int32_t>(i);
    }
    quantize_kv(make_view(u16_.back().data(), DType::bf16, Device{}, {n, kHeadDim}),
                make_view(slots.data(), DType::i32, Device{}, {n}), pool);
    return pool;
  }

  // Each request's pages are a random permutation of distinct pool pages.
  std::vector<int32_t> page_ids(int rows, int pages) {
    std::vector<int32_t> ids(rows * pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    return ids;
  }

  TensorView swa_block_table() {
    const int B = static_cast<int>(shape_.q_lens.size());
    std::vector<int32_t> table = page_ids(B, swa_pages_);
    if (shape_.evict_outside_window) {
      for (int b = 0; b < B; ++b) {
        const int first_seen = std::max(0, shape_.seq_lens[b] - shape_.q_lens[b] - shape_.window);
        for (int p = 0; (p + 1) * shape_.block_size <= first_seen; ++p)
          table[b * swa_pages_ + p] = -1;
      }
    }
    return keep(table, {B, swa_pages_});
  }

  void add_kv_source(const LayerSpec& s, int max_seq) {
    const int B = static_cast<int>(shape_.q_lens.size());
    const int pages = max_seq / s.compress_ratio / shape_.entries_per_page + 1;
    compressed_pools_[s.kv_source] =
        pool(B * pages, shape_.entries_per_page, shape_.compressed_span);
    inputs.compressed_block_tables[s.kv_source] = keep(page_ids(B, pages), {B, pages});
  }

  // Local top-k of an index source: distinct entries of those visible at pos, then -1 (or,
  // topk_tails, random entries of the request).
  void add_index_source(const LayerSpec& s, int max_seq) {
    const int64_t width = topk_width(s, max_seq);
    std::vector<int32_t> topk(T_ * width, -1);
    for (int t = 0; t < T_; ++t) {
      const int visible = (pos_[t] + 1) / s.compress_ratio;
      std::vector<int32_t> entries(visible);
      std::iota(entries.begin(), entries.end(), 0);
      if (s.index_topk > 0) std::shuffle(entries.begin(), entries.end(), rng_);
      for (int j = 0; j < std::min<int64_t>(visible, width); ++j) topk[t * width + j] = entries[j];
      if (!shape_.topk_tails) continue;
      // Entries below visible (0 when none is): inside the request's compressed pages.
      std::uniform_int_distribution<int32_t> entry(0, std::max(visible - 1, 0));
      for (int64_t j = visible; j < width; ++j) topk[t * width + j] = entry(rng_);
    }
    inputs.topk_indices[s.index_source] = keep(topk, {T_, width});
  }

  CaseShape shape_;
  std::mt19937_64 rng_;
  int T_ = 0;
  int swa_pages_ = 0;
  std::vector<int> request_, pos_;
  std::vector<uint8_t> valid_;
  std::map<int, TensorView> compressed_pools_;
  // Lists keep every buffer at a fixed address while views point into them.
  std::list<std::vector<int32_t>> i32_;
  std::list<std::vector<uint16_t>> u16_;
  std::list<std::vector<uint8_t>> u8_;
  std::list<std::vector<std::byte>> bytes_;
};

}  // namespace smla::test
