#include "synth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "cpu/parallel.h"
#include "host_memory.h"
#include "progress.h"
#include "smla/error.h"
#include "smla/quantize.h"

namespace smla::cli {
namespace {

using Rng = std::mt19937_64;
constexpr int64_t kTilePages = 256;                    // a pool without host copy repeats these
constexpr float kFp8KvScale = 0.5f;                    // per-tensor fp8: e4m3(x / kv_scale)

// Random storage codes of moderate magnitude, several from each 64-bit draw.
void fill_bf16(std::byte* out, int64_t count, Rng& rng) {  // |x| in [2^-7, 1)
  for (int64_t i = 0; i < count; i += 4) {
    uint64_t bits = rng();
    for (int64_t j = i; j < std::min(i + 4, count); ++j, bits >>= 16) {
      const uint16_t v = static_cast<uint16_t>((bits & 0x807f) | ((120 + (bits >> 7) % 7) << 7));
      std::memcpy(out + 2 * j, &v, 2);
    }
  }
}
void fill_e4m3(std::byte* out, int64_t count, Rng& rng) {  // |x| in [2^-6, 4): never NaN
  for (int64_t i = 0; i < count; i += 8) {
    uint64_t bits = rng();
    for (int64_t j = i; j < std::min(i + 8, count); ++j, bits >>= 8)
      out[j] = static_cast<std::byte>((bits & 0x87) | ((1 + (bits >> 3) % 8) << 3));
  }
}

int64_t page_bytes(KvLayout layout, int64_t block_size) {
  switch (layout) {
    case KvLayout::bf16:
      return block_size * kHeadDim * 2;
    case KvLayout::fp8_e4m3:
      return block_size * kHeadDim;
    case KvLayout::fp8_ds_mla: {  // SPEC §2: padded to a multiple of 576 B
      const int64_t used = block_size * (kDsMlaRecordBytes + kDsMlaScaleBytes);
      return (used + kDsMlaRecordBytes - 1) / kDsMlaRecordBytes * kDsMlaRecordBytes;
    }
  }
  return 0;
}

// `rows` random bf16 rows for an fp8 cache: each 64-value group of fill_bf16's values scaled by
// 2^-3..2^3, so that fp8_ds_mla's groups get different UE8M0 scales.
std::vector<std::byte> random_rows(int64_t rows, Rng& rng) {
  std::vector<std::byte> bytes(rows * kHeadDim * 2);
  fill_bf16(bytes.data(), rows * kHeadDim, rng);
  for (int64_t group = 0; group < rows * kHeadDim / 64; ++group) {
    const int shift = static_cast<int>(rng() % 7) - 3;  // exponents 117..129: all normal
    for (int64_t i = group * 64; i < (group + 1) * 64; ++i) {
      uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * i, 2);
      v = static_cast<uint16_t>(v + shift * 128);
      std::memcpy(bytes.data() + 2 * i, &v, 2);
    }
  }
  return bytes;
}

// One page of `layout`: bf16 rows random; fp8 rows random bf16 rows written by quantize_kv, as
// a model's cache writer would (what the decode op reads, and the oracle dequantizes).
void fill_page(std::byte* page, KvLayout layout, int64_t block_size, Rng& rng) {
  if (layout == KvLayout::bf16) return fill_bf16(page, block_size * kHeadDim, rng);
  std::vector<std::byte> rows = random_rows(block_size, rng);
  std::vector<int32_t> slots(block_size);
  std::iota(slots.begin(), slots.end(), 0);
  const DType dtype = kv_dtype(layout);
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype)), row = kv_row_bytes(layout) / elem;
  quantize_kv(make_view(rows.data(), DType::bf16, Device{}, {block_size, kHeadDim}),
              make_view(slots.data(), DType::i32, Device{}, {block_size}),
              make_view(page, dtype, Device{}, {1, block_size, row},
                        {page_bytes(layout, block_size) / elem, row, 1}),
              kFp8KvScale);
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());  // data() may be null
  return bytes;
}

// Request-major pages: each request's first `evicted` pages are -1 (evicted), its others ids
// drawn from a shuffled pool of requests * (pages - evicted).
std::vector<int32_t> block_table(int64_t requests, int64_t pages, int64_t evicted, Rng& rng) {
  std::vector<int32_t> ids((pages - evicted) * requests);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(requests * pages, -1);
  for (int64_t b = 0, next = 0; b < requests; ++b)
    for (int64_t p = evicted; p < pages; ++p) table[b * pages + p] = ids[next++];
  return table;
}

}  // namespace

DType kv_dtype(KvLayout layout) {
  switch (layout) {
    case KvLayout::bf16:
      return DType::bf16;
    case KvLayout::fp8_e4m3:
      return DType::f8e4m3;
    case KvLayout::fp8_ds_mla:
      return DType::u8;
  }
  return DType::u8;
}

DType query_dtype(KvLayout layout) {
  return layout == KvLayout::fp8_e4m3 ? DType::f8e4m3 : DType::bf16;
}

void SynthStep::place(std::vector<std::byte> bytes, DType dtype,
                      std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                      TensorView& host_view, TensorView& device_view, bool host_copy) {
  Buffer& buffer = buffers_.emplace_back(Buffer{std::move(bytes), nullptr});
  host_view = make_view(buffer.host.data(), dtype, Device{}, shape, strides);
  device_view = host_view;
  if (streams_.device().kind == DeviceKind::cpu) return;
  buffer.device = streams_.allocate(buffer.host.size());
  streams_.upload(buffer.device.get(), buffer.host.data(), buffer.host.size());
  device_view.data = buffer.device.get();
  device_view.device = streams_.device();
  if (host_copy) return;
  std::vector<std::byte>().swap(buffer.host);  // its memory too (`= {}` keeps the capacity)
  host_view = {};
}

void* SynthStep::tiled(const std::vector<std::byte>& tile, int64_t bytes) {
  Buffer& buffer = buffers_.emplace_back(Buffer{{}, streams_.allocate(static_cast<size_t>(bytes))});
  std::byte* device_bytes = static_cast<std::byte*>(buffer.device.get());
  const int64_t period = static_cast<int64_t>(tile.size());
  for (int64_t offset = 0; offset < bytes; offset += period)
    streams_.upload(device_bytes + offset, tile.data(), std::min(period, bytes - offset));
  return buffer.device.get();
}

SynthStep::SynthStep(const RunOptions& o, const std::vector<LayerSpec>& specs, Streams& streams)
    : streams_(streams) {
  Rng rng(o.seed);
  const int64_t B = o.requests, q_len = o.q_len, seq_len = o.seq_len;
  const int window = specs.front().window;
  const int64_t T = B * q_len;
  num_tokens = T;
  const KvLayout layout = o.kv;
  const int64_t swa_page = page_bytes(layout, kSwaBlockSize);
  const int64_t c_page = page_bytes(layout, kCompressedBlockSize);
  const int64_t swa_pages = (seq_len + kSwaBlockSize - 1) / kSwaBlockSize;
  const int64_t first_seen = std::max<int64_t>(seq_len - q_len - window + 1, 0);
  const int64_t evicted = first_seen / kSwaBlockSize;  // SWA pages no token of the step sees
  auto compressed_pages = [&](const LayerSpec& s) {
    return std::max<int64_t>(
        1, (seq_len / s.compress_ratio + kCompressedBlockSize - 1) / kCompressedBlockSize);
  };
  // In floating point: the flags' products may pass int64 before the limit refuses them.
  double pool_bytes = 0, row_bytes = 0;  // the pools; the queries and outputs
  double index_bytes = 0, layer_rows = 0;  // tables and top-k (kept on the host); one layer's rows
  int groups = 0;
  for (const LayerSpec& s : specs) {
    groups = std::max(groups, s.swa_group + 1);
    pool_bytes += double(B) * double(swa_pages - evicted) * double(swa_page);
    if (s.compress_ratio > 0 && s.kv_source == s.layer) {
      pool_bytes += double(B) * double(compressed_pages(s)) * double(c_page);
      index_bytes += double(B) * double(compressed_pages(s)) * 4;
    }
    if (s.compress_ratio > 0 && s.index_source == s.layer)
      index_bytes += 2.0 * double(T) * double(topk_width(s, seq_len)) * 4;  // + bytes_of
    const double rows = double(T) * s.num_heads * kHeadDim * (dtype_size(query_dtype(layout)) + 2);
    row_bytes += rows;
    layer_rows = std::max(layer_rows, rows);
  }
  index_bytes += double(groups + 1) * double(B) * double(swa_pages) * 4;
  // The oracle reads host copies; on the CPU the pools are host memory anyway. Device memory
  // is the allocator's to refuse, past a bound that keeps the byte counts int64; the host then
  // holds the tables, the top-k and one layer's queries and outputs on their way up.
  const bool host_copies = o.check > 0 || streams.device().kind == DeviceKind::cpu;
  const double host_bytes = index_bytes + (host_copies ? pool_bytes + row_bytes : layer_rows);
  const double limit = host_limit_bytes();
  const auto mib = [](double bytes) { return std::to_string(int64_t(bytes / 1048576)) + " MiB"; };
  const bool check_copies = host_copies && streams.device().kind != DeviceKind::cpu;
  if (host_bytes > limit || pool_bytes + row_bytes > 0x1p62)
    throw Error(ErrorKind::value,
                check_copies ? "--requests, --seq-len, --q-len (with --model and --kv), --check"
                             : "--requests, --seq-len, --q-len (with --model and --kv)",
                "a step whose host memory fits in " + mib(limit) +
                    " (two thirds of this machine's or container's memory" +
                    (check_copies ? "; --check 0 keeps the pools on the device only)" : ")"),
                mib(pool_bytes) + " of KV pools, " + mib(row_bytes) + " of queries and outputs" +
                    (host_copies ? "" : " (on the device)") + " and " + mib(index_bytes) +
                    " of block tables and top-k");
  kv_bytes = int64_t(pool_bytes);

  // Step metadata: every request decodes q_len tokens at the end of its context.
  StepMetadata meta{.num_tokens = T, .num_decodes = B, .max_q_len = static_cast<int>(q_len)};
  std::vector<int32_t> seq_lens(B, static_cast<int32_t>(seq_len)), cum(B + 1);
  for (int64_t b = 0; b <= B; ++b) cum[b] = static_cast<int32_t>(b * q_len);
  host.inputs.metadata = device.inputs.metadata = meta;
  place(bytes_of(seq_lens), DType::i32, {B}, {1}, host.inputs.metadata.seq_lens,
        device.inputs.metadata.seq_lens);
  place(bytes_of(cum), DType::i32, {B + 1}, {1}, host.inputs.metadata.cum_seq_lens_q,
        device.inputs.metadata.cum_seq_lens_q);
  host.inputs.block_tables.resize(groups);
  device.inputs.block_tables.resize(groups);
  for (int g = 0; g < groups; ++g)
    place(bytes_of(block_table(B, swa_pages, evicted, rng)), DType::i32, {B, swa_pages},
          {swa_pages, 1}, host.inputs.block_tables[g], device.inputs.block_tables[g]);

  Progress progress("synthesizing", static_cast<int64_t>(specs.size()), o.progress);
  std::map<int64_t, std::vector<std::byte>> tiles;  // by page bytes: pages repeated in pools
  // Pages filled in parallel, each from its own generator seeded by one draw of `rng` and its
  // index: the same bytes whatever the thread count.
  auto random_pages = [&](int64_t pages, int64_t block_size, int64_t bytes_per_page) {
    std::vector<std::byte> bytes(pages * bytes_per_page);
    const uint64_t seed = rng();
    cpu::parallel_for(pages, [&](int64_t p) {
      Rng page_rng(seed + static_cast<uint64_t>(p));
      fill_page(bytes.data() + p * bytes_per_page, layout, block_size, page_rng);
    });
    return bytes;
  };
  auto pool = [&](int64_t pages, int64_t block_size, int64_t bytes_per_page, TensorView& h,
                  TensorView& d) {
    // Rows of 512 elements, or fp8_ds_mla's 584 bytes: strides in elements of the pool dtype.
    const DType dtype = kv_dtype(layout);
    const int64_t elem = static_cast<int64_t>(dtype_size(dtype)), row = kv_row_bytes(layout) / elem;
    if (host_copies) {
      place(random_pages(pages, block_size, bytes_per_page), dtype, {pages, block_size, row},
            {bytes_per_page / elem, row, 1}, h, d);
      return;
    }
    auto [tile, fresh] = tiles.try_emplace(bytes_per_page);
    if (fresh) tile->second = random_pages(kTilePages, block_size, bytes_per_page);
    h = {};
    d = make_view(tiled(tile->second, pages * bytes_per_page), dtype, streams.device(),
                  {pages, block_size, row}, {bytes_per_page / elem, row, 1});
  };
  const bool fp8 = query_dtype(layout) == DType::f8e4m3;
  const float q_scale = 1.0f, kv_scale = fp8 ? kFp8KvScale : 1.0f;    // per-tensor fp8 scales
  std::map<int, std::pair<TensorView, TensorView>> compressed_pools;  // by kv source
  for (const LayerSpec& s : specs) {
    AttentionLayer h{.spec = s}, d{.spec = s};
    h.bmm1_scale = d.bmm1_scale = q_scale * kv_scale / std::sqrt(static_cast<float>(kHeadDim));
    h.bmm2_scale = d.bmm2_scale = kv_scale;
    pool(B * (swa_pages - evicted), kSwaBlockSize, swa_page, h.swa_kv_cache, d.swa_kv_cache);
    if (s.compress_ratio > 0) {
      if (!compressed_pools.contains(s.kv_source)) {
        const int64_t pages = compressed_pages(s);
        auto& [ph, pd] = compressed_pools[s.kv_source];
        pool(B * pages, kCompressedBlockSize, c_page, ph, pd);
        place(bytes_of(block_table(B, pages, 0, rng)), DType::i32, {B, pages}, {pages, 1},
              host.inputs.compressed_block_tables[s.kv_source],
              device.inputs.compressed_block_tables[s.kv_source]);
      }
      std::tie(h.compressed_kv_cache, d.compressed_kv_cache) = compressed_pools.at(s.kv_source);
      if (!host.inputs.topk_indices.contains(s.index_source)) {
        // The index source's local top-k: distinct visible entries (all of them, in order,
        // for a layer without an indexer), -1 padded.
        const int64_t width = topk_width(s, seq_len);
        std::vector<int32_t> topk(T * width, -1), entries;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t pos = seq_len - q_len + t % q_len;
          entries.resize((pos + 1) / s.compress_ratio);
          std::iota(entries.begin(), entries.end(), 0);
          const int64_t kept = std::min<int64_t>(width, static_cast<int64_t>(entries.size()));
          for (int64_t j = 0; j < kept; ++j) {
            if (s.index_topk > 0) std::swap(entries[j], entries[j + rng() % (entries.size() - j)]);
            topk[t * width + j] = entries[j];
          }
        }
        place(bytes_of(topk), DType::i32, {T, width}, {width, 1},
              host.inputs.topk_indices[s.index_source], device.inputs.topk_indices[s.index_source]);
      }
    }
    std::vector<float> sinks(s.num_heads);
    for (float& v : sinks) v = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
    place(bytes_of(sinks), DType::f32, {s.num_heads}, {1}, h.sinks, d.sinks);
    std::vector<std::byte> query(T * s.num_heads * kHeadDim * (fp8 ? 1 : 2));
    (fp8 ? fill_e4m3 : fill_bf16)(query.data(), T * s.num_heads * kHeadDim, rng);
    TensorView qh, qd, oh, od;
    place(std::move(query), query_dtype(layout), {T, s.num_heads, kHeadDim},
          {s.num_heads * kHeadDim, kHeadDim, 1}, qh, qd, host_copies);
    place(std::vector<std::byte>(T * s.num_heads * kHeadDim * 2), DType::bf16,
          {T, s.num_heads, kHeadDim}, {s.num_heads * kHeadDim, kHeadDim, 1}, oh, od, host_copies);
    host.queries.push_back(qh);
    device.queries.push_back(qd);
    host.outs.push_back(oh);
    device.outs.push_back(od);
    host.layers.push_back(h);
    device.layers.push_back(d);

    // What the step attends: each token's causal window, plus its valid top-k entries.
    int64_t columns = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = seq_len - q_len + t % q_len;
      columns += std::min<int64_t>(pos + 1, window);
      if (s.compress_ratio == 0) continue;
      const TensorView& topk = host.inputs.topk_indices.at(s.index_source);
      for (int64_t j = 0; j < topk.size(1); ++j)
        columns += topk.ptr<int32_t>()[t * topk.size(1) + j] >= 0;
    }
    attended.push_back(columns);
    SparseIndexArgs args{.step = meta, .window = window};
    if (s.compress_ratio > 0)
      args.compressed = {s.compress_ratio, host.inputs.topk_indices.at(s.index_source)};
    max_columns = std::max(max_columns, sparse_index_columns(args));
    progress.advance();
  }
}

void SynthStep::download_rows(size_t index, const std::vector<Row>& rows) {
  const TensorView &h = host.outs[index], &d = device.outs[index];
  if (h.data == d.data) return;               // on the CPU they are one tensor
  constexpr size_t kRowBytes = kHeadDim * 2;  // bf16
  for (const Row& r : rows) {
    const int64_t offset = (r.token * h.strides[0] + r.head * h.strides[1]) * 2;
    streams_.download(static_cast<std::byte*>(h.data) + offset,
                      static_cast<const std::byte*>(d.data) + offset, kRowBytes);
  }
}

void SynthStep::clear_outs() {
  for (const TensorView& out : device.outs)
    streams_.zero(out.data, static_cast<size_t>(out.numel()) * dtype_size(out.dtype));
}

}  // namespace smla::cli
