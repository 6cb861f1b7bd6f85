// The CUDA index builder against the CPU builder (the spec) bit for bit over random steps, and
// its -1 columns where the CPU throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <list>
#include <random>
#include <vector>

#include "case_gen.h"
#include "device_step.h"
#include "direct_call.h"
#include "error_check.h"
#include "smla/error.h"
#include "smla/index.h"
#include "smla/tables.h"
#include "step_case.h"

namespace smla::test {
namespace {

struct Built {
  std::vector<std::byte> indices, lens, seq_lens;
};

// Outputs for `a` in host memory, every byte 0xa5 like DeviceMirror::output's.
class HostOutputs {
 public:
  TensorView operator()(DType dtype, std::initializer_list<int64_t> shape) {
    TensorView v = make_view(nullptr, dtype, Device{}, shape);
    buffers_.emplace_back(extent_bytes(v), std::byte{0xa5});
    v.data = buffers_.back().data();
    return v;
  }

 private:
  std::list<std::vector<std::byte>> buffers_;
};

// The table of `host_args` built on the CPU, or on the GPU through `gpu` when given. Outputs
// start as garbage (0xa5 bytes), so an unwritten element shows; the indices' rows lie `pad`
// columns further apart than K, so strides must be honoured.
Built build(const SparseIndexArgs& host_args, DeviceMirror* gpu, int64_t pad = 0) {
  SparseIndexArgs a = gpu ? (*gpu)(host_args) : host_args;
  const int64_t T = a.step.num_tokens, K = sparse_index_columns(a);
  HostOutputs host;
  auto make = [&](DType dtype, std::initializer_list<int64_t> shape) {
    return gpu ? gpu->output(dtype, shape) : host(dtype, shape);
  };
  a.out.sparse_indices = make(DType::i32, {T, K + pad});
  a.out.sparse_indices.shape[1] = K;  // row stride K + pad
  a.out.sparse_topk_lens = make(DType::i32, {T});
  if (a.step.decode_swa_width > a.window) a.out.seq_lens = make(DType::i32, {T});
  if (gpu) {
    TestStream stream;
    build_sparse_indices(a, stream.get());
    stream.synchronize();
  } else {
    build_sparse_indices(a);
  }
  return {bytes_of(a.out.sparse_indices), bytes_of(a.out.sparse_topk_lens),
          bytes_of(a.out.seq_lens)};
}

void expect_same(const SparseIndexArgs& a, int64_t pad, const std::string& what) {
  DeviceMirror gpu;
  const Built cpu = build(a, nullptr, pad), device = build(a, &gpu, pad);
  EXPECT_TRUE(cpu.indices == device.indices) << what << ": indices";
  EXPECT_TRUE(cpu.lens == device.lens) << what << ": lengths";
  EXPECT_TRUE(cpu.seq_lens == device.seq_lens) << what << ": seq_lens";
}

void expect_same(const StepCase& c, int layer, int64_t pad, const std::string& what) {
  expect_same(c.args(layer), pad, what + ", layer " + std::to_string(layer));
}

int32_t* i32_data(const TensorView& v) { return static_cast<int32_t*>(v.data); }

// Negative entries other than -1 in some top-k rows (copied as they are, never counted by a
// decode row), each at its row's first padding entry or else its last, so that a decode row's
// valid entries stay first (SPEC §4); and a huge page id whose offsets int32 cannot hold (-1).
void add_odd_entries(StepCase& c, std::mt19937& rng) {
  const int32_t odd[] = {-2, -77, INT32_MIN};
  for (auto& [layer, topk] : c.inputs.topk_indices)
    for (int64_t t = 0; t < topk.size(0) && topk.size(1) > 0; t += 3) {
      int32_t* row = i32_data(topk) + t * topk.strides[0];
      int64_t j = 0;
      while (j < topk.size(1) - 1 && row[j] >= 0) ++j;
      row[j] = odd[rng() % 3];
    }
  const TensorView& table = c.inputs.block_tables.front();
  i32_data(table)[table.numel() - 1] = INT32_MAX / 2;
}

// Random steps (random_shape: empty requests, padding tokens, evicted and packed pages), a third
// of them with a window of 1 to 300.
TEST(GpuIndex, RandomStepsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int trial = 0; trial < 40; ++trial) {
    CaseShape s = random_shape(rng, trial);
    if (trial % 3 == 1) s.window = std::uniform_int_distribution<int>(1, 300)(rng);
    StepCase c(three_layers(std::uniform_int_distribution<int>(1, 4)(rng), s.window), s, rng());
    if (trial % 4 == 2) add_odd_entries(c, rng);
    for (int layer = 0; layer < 3; ++layer)
      expect_same(c, layer, trial % 2 ? 3 : 0, "trial " + std::to_string(trial));
    if (HasFailure()) return;
  }
}

TEST(GpuIndex, RandomDsparkStepsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int trial = 0; trial < 16; ++trial) {
    const StepCase c({{.layer = 0, .num_heads = 1}}, random_dspark_shape(rng, trial), rng());
    expect_same(c, 0, trial % 3 == 1 ? 5 : 0, "trial " + std::to_string(trial));
    if (HasFailure()) return;
  }
}

// A DSpark draft block longer than its window allows (q_len past decode_swa_width - W: refused on
// the CPU, where the values are read; unseen on the GPU) claims at most K columns, so that a
// decode reading the table stays inside it.
TEST(GpuIndex, AnOversizedDraftBlockClaimsAtMostKColumns) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const CaseShape s{.q_lens = {3, 80},
                    .seq_lens = {200, 600},
                    .num_decodes = 2,
                    .decode_swa_width = dspark_swa_width(kWindow, 8)};
  const StepCase c({{.layer = 0, .num_heads = 1}}, s, seed);
  const SparseIndexArgs a = c.args(0);
  const int64_t K = sparse_index_columns(a);
  ASSERT_LT(K, kWindow + 80) << "the block must outgrow the window";
  test::expect_smla_error([&] { build(a, nullptr); }, ErrorKind::value, "cum_seq_lens_q",
                          "q_len <= decode_swa_width - window", "q_len 80 for request 1");
  DeviceMirror gpu;
  const Built device = build(a, &gpu);
  const auto* lens = reinterpret_cast<const int32_t*>(device.lens.data());
  for (int64_t t = 0; t < c.num_tokens(); ++t) EXPECT_LE(lens[t], K) << "token " << t;
  EXPECT_EQ(lens[c.num_tokens() - 1], K) << "the oversized block's tokens take all K";
}

// Large steps: many CTAs, rows of one pass of the CTA's columns (W + 1024) and of two
// (W + 2000, the second pass holding entries of request 0 and -1 padding of request 2).
TEST(GpuIndex, WideAndLongTablesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const CaseShape s{.q_lens = {4, 1, 1500, 700},
                    .seq_lens = {9000, 130, 4000, 700},
                    .num_decodes = 2,
                    .block_size = 64,
                    .span = 72,
                    .entries_per_page = 64,
                    .compressed_span = 64,
                    .topk_tails = true};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (const int topk : {1024, 2000}) {
    std::vector<LayerSpec> layers = three_layers(4);
    layers[2].index_topk = topk;
    const StepCase c(layers, s, seed);
    for (int layer = 0; layer < 3; ++layer)
      expect_same(c, layer, topk > 1024 ? 3 : 0, "wide, top-k " + std::to_string(topk));
  }
}

// Many requests: the CTA's count over cum_seq_lens_q takes up to two entries a thread (B > 512),
// some requests are empty (equal starts), and decode rows take two passes (W + 1500). A step of
// one-token requests also runs without cum_seq_lens_q (each token its own request).
TEST(GpuIndex, ManyRequestsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<LayerSpec> layers = three_layers(2);
  layers[2].index_topk = 1500;
  for (const bool mixed : {true, false}) {
    CaseShape s{.num_decodes = mixed ? 450 : 700,
                .span = 18,
                .compressed_span = 9,
                .invalid_fraction = 0.1,
                .evict_outside_window = true};
    std::uniform_int_distribution<int> decode_len(1, mixed ? 4 : 1), prefill_len(0, 24),
        extra(0, 150);
    for (int b = 0; b < 700; ++b) {
      s.q_lens.push_back(b < s.num_decodes ? decode_len(rng) : prefill_len(rng));
      s.seq_lens.push_back(s.q_lens.back() + extra(rng));
    }
    StepCase c(layers, s, rng());
    add_odd_entries(c, rng);
    const std::string what = mixed ? "mixed q_len" : "one token each";
    for (int layer = 0; layer < 3; ++layer) {
      expect_same(c, layer, 3, what);
      if (mixed) continue;
      SparseIndexArgs a = c.args(layer);
      a.step.cum_seq_lens_q = {};
      expect_same(a, 0, what + " without cum_seq_lens_q, layer " + std::to_string(layer));
    }
    if (HasFailure()) return;
  }
}

// SPEC §4 / docs/sparse_index.md: a block-table page or top-k index out of range throws on the
// CPU; the GPU (which cannot read values without a sync) writes -1 in that column instead.
TEST(GpuIndex, OutOfRangePagesAndIndicesBecomePadding) {
  SKIP_WITHOUT_GPU();
  const CaseShape s{.q_lens = {1, 3, 1},
                    .seq_lens = {200, 260, 90},
                    .num_decodes = 3,
                    .block_size = 16,
                    .span = 16};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  StepCase c(three_layers(4), s, seed);
  const int64_t T = c.num_tokens();
  const int W = kWindow;

  // Layer 2: each decode token's first valid top-k entry points past the compressed pages.
  SparseIndexArgs a = c.args(2);
  const Built good = build(a, nullptr);
  const int64_t K = sparse_index_columns(a);
  std::vector<int32_t> want(T * K);
  std::memcpy(want.data(), good.indices.data(), good.indices.size());
  TensorView& topk = a.compressed.topk_indices;
  const int64_t past = a.compressed.block_table.size(1) * a.compressed.compressed_kv_cache.size(1);
  for (int64_t t = 0; t < T; ++t)
    if (i32_data(topk)[t * topk.strides[0]] >= 0) {
      i32_data(topk)[t * topk.strides[0]] = static_cast<int32_t>(past + t);
      want[t * K + W] = -1;
    }
  test::expect_smla_error([&] { build(a, nullptr); }, ErrorKind::value, "topk_indices",
                          "local indices below compressed.block_table pages", "topk_indices[");
  DeviceMirror gpu;
  Built device = build(a, &gpu);
  EXPECT_EQ(std::memcmp(device.indices.data(), want.data(), device.indices.size()), 0)
      << "top-k past the compressed block table";
  EXPECT_TRUE(device.lens == good.lens) << "the entry still counts: it is >= 0";

  // Layer 0: the SWA block table loses its last page.
  SparseIndexArgs swa = c.args(0);
  const Built whole = build(swa, nullptr);
  std::vector<int32_t> swa_want(T * W);
  std::memcpy(swa_want.data(), whole.indices.data(), whole.indices.size());
  swa.swa.block_table.shape[1] -= 1;
  const int64_t pages = swa.swa.block_table.size(1), block_size = s.block_size;
  int dropped = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = c.pos(static_cast<int>(t)), start = std::max<int64_t>(pos - W + 1, 0);
    for (int64_t p = start; p <= pos; ++p)
      if (p / block_size >= pages) swa_want[t * W + (p - start)] = -1, ++dropped;
  }
  ASSERT_GT(dropped, 0);
  test::expect_smla_error([&] { build(swa, nullptr); }, ErrorKind::value, "block_table",
                          "a page for position", "[");
  DeviceMirror gpu2;
  device = build(swa, &gpu2);
  EXPECT_EQ(std::memcmp(device.indices.data(), swa_want.data(), device.indices.size()), 0)
      << "positions past the SWA block table";
  EXPECT_TRUE(device.lens == whole.lens);
}

TEST(GpuIndex, DeviceArgumentsAreCheckedOnTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const StepCase c(three_layers(2), random_shape(rng, 1), 5);
  DeviceMirror gpu;
  SparseIndexArgs a = gpu(c.args(2));
  a.out =
      table_outputs(a, [&](DType d, std::initializer_list<int64_t> s) { return gpu.output(d, s); });
  a.compressed.block_table.device = Device{};  // a host block table with device outputs
  try {
    build_sparse_indices(a);
    ADD_FAILURE() << "a cpu block table passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "compressed.block_table");
    EXPECT_EQ(e.kind(), ErrorKind::type);
  }
}

// Tables size their memory from num_tokens; a device's cum_seq_lens_q, which would refuse one
// past its requests', is not read on the host. T <= B x max_q_len is, before the allocation:
// 2^28 tokens of three requests had sized 128 GiB (the window's 128 columns), refused as out of
// memory rather than by name.
TEST(GpuIndex, TablesRefuseTokensPastTheRequestsBeforeAllocating) {
  SKIP_WITHOUT_GPU();
  const std::vector<LayerSpec> layers = three_layers(2);  // layer 0: SWA-only, window 128
  const StepCase c(layers, {.q_lens = {1, 2, 1}, .seq_lens = {150, 260, 40}, .num_decodes = 3},
                   fresh_seed());
  DeviceMirror gpu;
  TestStream stream;
  const auto streams = make_streams(gpu.device, stream.get());
  SparseIndexTables tables(layers, *streams);
  const TableInputs inputs = [&](int layer) {
    SparseIndexArgs a = gpu(c.args(layer));
    a.step.num_tokens = int64_t{1} << 28;
    a.step.is_valid_token = TensorView{};  // its [T] would be refused first
    return a;
  };
  test::expect_smla_error([&] { tables.lookup(0, inputs); }, ErrorKind::value, "num_tokens",
                          "<= B x max_q_len = 3 x 2", "268435456");
  EXPECT_EQ(tables.stats().bytes, 0u);
  tables.lookup(0, [&](int layer) { return gpu(c.args(layer)); });  // the step as it is
  stream.synchronize();
  EXPECT_GT(tables.stats().bytes, 0u);
}

}  // namespace
}  // namespace smla::test
