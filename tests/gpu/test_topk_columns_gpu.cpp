// TopkColumns on CUDA: a decode translating its compressed columns from the top-k in the kernel
// equals, bit for bit, the decode on the table the CUDA builder makes from the same top-k (decode
// and prefill rows, padding tokens, packed pages, -1 anywhere in a row, entries past the block
// table; every cache layout and query dtype), on poisoned outputs, and agrees with the CPU
// backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "case_gen.h"
#include "device_step.h"
#include "direct_call.h"
#include "oracle.h"
#include "ref_numeric.h"
#include "smla/error.h"
#include "step_case.h"

namespace smla::test {
namespace {

// The split-KV buffers a launch of T tokens, `heads` heads and K columns may use, zeroed.
void add_split_buffers(DecodeArgs& d, DeviceMirror& gpu, int64_t T, int heads, int64_t K) {
  const size_t counters = kv_counter_bytes(T, heads);
  const size_t workspace = workspace_bytes(T, heads, K, gpu.device);
  if (counters) d.kv_counters = gpu.output(DType::u8, {int64_t(counters)}, 0);
  if (workspace) d.workspace = gpu.output(DType::u8, {int64_t(workspace)}, 0);
}

// Every bf16 of `got` within tol |want| + tol max |want| of its (token, head) row of `want`;
// never NaN. tol: the kernel's against the CPU for a query of `query` (tests/oracle.h).
void expect_close_bf16(const std::vector<std::byte>& got, const TensorView& want, DType query,
                       const std::string& where) {
  const double tol = Tolerance::device(query).out_rtol;
  const auto* g = reinterpret_cast<const uint16_t*>(got.data());
  const auto* w = want.ptr<const uint16_t>();
  int bad = 0;
  for (int64_t row = 0; row < want.numel() / kHeadDim && bad < 5; ++row) {
    double scale = 0;
    for (int d = 0; d < kHeadDim; ++d)
      scale = std::fmax(scale, std::fabs(ref_bf16(w[row * kHeadDim + d])));
    for (int64_t i = row * kHeadDim; i < (row + 1) * kHeadDim; ++i) {
      const double a = ref_bf16(g[i]), b = ref_bf16(w[i]);
      if (!(std::fabs(a - b) <= tol * (std::fabs(b) + scale)) && bad++ < 5)
        ADD_FAILURE() << where << ": element " << i << " is " << a << ", CPU " << b;
    }
  }
}

// A host tensor of `c`'s whose every byte is 0xff (NaN as bf16 or f32, -1 as i32): an output
// left unwritten then fails the comparison.
TensorView poisoned(StepCase& c, DType dtype, std::initializer_list<int64_t> shape) {
  const TensorView v = c.zeros(dtype, shape);
  std::memset(v.data, 0xff, static_cast<size_t>(v.numel()) * dtype_size(dtype));
  return v;
}

TEST(GpuTopkColumns, EqualTheBuiltTableBitForBitAndTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int heads_of[] = {1, 16, 64, 100, 128};
  int64_t attended = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int H = heads_of[trial % 5];
    const LayoutKind kind = kLayoutKinds[trial / 5 % std::size(kLayoutKinds)];
    std::vector<LayerSpec> specs = three_layers(1 + trial % 4);
    for (LayerSpec& s : specs) s.num_heads = H;
    // Trials 0, 1, 8, 9, 16, 17 (valid tails): a top-k wider than the 512 entries the kernel
    // counts in one pass, whose decode rows then hold up to 1100 valid entries.
    if (trial % 8 < 2) specs[2].index_topk = 1100;
    CaseShape shape = random_shape(rng, trial);
    shape.layout = kind.layout;
    // Trials 0, 4, ...: entries past a row's first (pos + 1) / ratio are valid ones, which no
    // path may attend in a prefill row and every path must in a decode row.
    shape.topk_tails = trial % 4 == 0;
    StepCase c(specs, shape, rng());
    // Odd trials: -1 and -7 anywhere in the rows, which the CUDA paths take as they come but
    // the CPU refuses in a decode row (a valid entry after a negative one, SPEC §4), so it is
    // not compared there; trials 3, 7, ... also entries past the block table, which both CUDA
    // paths read as -1 (the CPU throws). Trials 2, 6, ...: some rows -1 and -7 from a random
    // entry on, valid ones first, compared with the CPU too.
    const bool anywhere = trial % 2 == 1, past_table = trial % 4 == 3, cut = trial % 4 == 2;
    for (auto& [layer, topk] : c.inputs.topk_indices) {
      int32_t* x = topk.ptr<int32_t>();
      const int64_t width = topk.size(1);
      std::bernoulli_distribution hole(anywhere ? 0.2 : 0.0), far(past_table ? 0.05 : 0.0),
          cut_row(cut ? 0.3 : 0.0);
      for (int64_t i = 0; i < topk.numel(); ++i) {
        if (hole(rng)) x[i] = i % 2 ? -1 : -7;
        if (far(rng)) x[i] = 1 << 20;
      }
      for (int64_t t = 0; width > 0 && t < topk.size(0); ++t)
        if (cut_row(rng))
          for (int64_t j = int64_t(rng() % width); j < width; ++j)
            x[t * width + j] = j % 2 ? -1 : -7;
    }
    const int64_t T = c.num_tokens();
    // Every third trial: plans without splits (no clusters, no split buffers), where the bf16
    // kernels read the query by TMA.
    const bool unsplit = trial % 3 == 2;
    std::optional<CountersOnly> counters_only;
    if (unsplit) counters_only.emplace();
    DeviceMirror gpu;
    const std::vector<AttentionLayer> layers = gpu(c.layers);
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const AttentionLayer& l = layers[i];
      if (l.spec.compress_ratio == 0) continue;
      const std::string where = "trial " + std::to_string(trial) + ", " +
                                kv_layout_name(kind.layout) + " cache, " + dtype_name(kind.query) +
                                " query, H " + std::to_string(H) + ", layer " +
                                std::to_string(l.spec.layer);
      const SparseIndexArgs host = c.args(l.spec.layer);
      auto make = [&](DType dtype, std::initializer_list<int64_t> shape) {
        return gpu.output(dtype, shape);
      };
      const SparseIndexArgs full = built(gpu(host), make);
      const SparseIndexArgs swa = built(swa_only(full), make);

      const TensorView q_host = c.query(T, H, kind.query), q = gpu(q_host);
      // Poisoned differently, so that elements neither path writes do not compare equal.
      DecodeArgs table =
          direct_decode_args(l, full, q, gpu.output(DType::bf16, {T, H, kHeadDim}, 0xff));
      DecodeArgs topk = topk_decode_args(l, swa, full.compressed, q,
                                         gpu.output(DType::bf16, {T, H, kHeadDim}, 0xa5));
      table.lse = gpu.output(DType::f32, {T, H}, 0xff);
      topk.lse = gpu.output(DType::f32, {T, H}, 0xa5);
      const int64_t K = full.out.sparse_indices.size(1);
      for (DecodeArgs* d : {&table, &topk}) {
        if (!unsplit) add_split_buffers(*d, gpu, T, H, K);
        sparse_mla_decode(*d);
      }
      CUDA_THROW(cudaDeviceSynchronize());
      const std::vector<std::byte> out = bytes_of(topk.out);
      EXPECT_EQ(out, bytes_of(table.out)) << where;
      const std::vector<std::byte> lse = bytes_of(topk.lse);
      EXPECT_EQ(lse, bytes_of(table.lse)) << where;
      // Equal NaN (a row both read wrongly, or poison both left) is no pass either.
      EXPECT_FALSE(any_bf16_nan(out.data(), out.size())) << where;
      EXPECT_FALSE(any_f32_nan(lse.data(), lse.size())) << where;
      const std::vector<std::byte> lens = bytes_of(full.out.sparse_topk_lens);
      for (int64_t t = 0; t < T; ++t)
        attended += reinterpret_cast<const int32_t*>(lens.data())[t] - l.spec.window;
      if (anywhere) continue;

      // the CPU's table and decode of the same step
      const SparseIndexArgs cpu =
          built(host, [&](DType dtype, std::initializer_list<int64_t> shape) {
            return poisoned(c, dtype, shape);
          });
      const TensorView cpu_out = poisoned(c, DType::bf16, {T, H, kHeadDim});
      sparse_mla_decode(direct_decode_args(c.layers[i], cpu, q_host, cpu_out));
      expect_close_bf16(out, cpu_out, kind.query, where);
    }
  }
  EXPECT_GT(attended, 0);  // compressed columns were there to compare
}

// A top-k of no entries ([T, 0], whose data PyTorch leaves null): each row's window alone,
// as on the CPU, and no read through the null pointer (it had killed the context).
TEST(GpuTopkColumns, AnEmptyTopkReadsTheWindowAlone) {
  SKIP_WITHOUT_GPU();
  std::vector<LayerSpec> specs = three_layers(2);
  for (LayerSpec& s : specs) s.num_heads = 16;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  StepCase c(specs, {.q_lens = {1, 2}, .seq_lens = {200, 9000}, .num_decodes = 2}, seed);
  const int64_t T = c.num_tokens();
  const int H = specs[2].num_heads;
  DeviceMirror gpu;
  const AttentionLayer l = gpu(c.layers)[2];
  const SparseIndexArgs host = c.args(2);
  CompressedColumns compressed = gpu(host).compressed;
  compressed.topk_indices = make_view(nullptr, DType::i32, gpu.device, {T, 0});
  const auto on_gpu = [&](DType dtype, std::initializer_list<int64_t> shape) {
    return gpu.output(dtype, shape);
  };
  const SparseIndexArgs swa = built(swa_only(gpu(host)), on_gpu);
  const TensorView q_host = c.bf16(T, H);
  const DecodeArgs args = topk_decode_args(l, swa, compressed, gpu(q_host),
                                           gpu.output(DType::bf16, {T, H, kHeadDim}, 0xff));
  sparse_mla_decode(args);
  CUDA_THROW(cudaDeviceSynchronize());

  CompressedColumns cpu_compressed = host.compressed;
  cpu_compressed.topk_indices = make_view(nullptr, DType::i32, Device{}, {T, 0});
  const auto on_cpu = [&](DType dtype, std::initializer_list<int64_t> shape) {
    return poisoned(c, dtype, shape);
  };
  const SparseIndexArgs cpu_swa = built(swa_only(host), on_cpu);
  const TensorView cpu_out = poisoned(c, DType::bf16, {T, H, kHeadDim});
  sparse_mla_decode(topk_decode_args(c.layers[2], cpu_swa, cpu_compressed, q_host, cpu_out));
  expect_close_bf16(bytes_of(args.out), cpu_out, DType::bf16, "an empty top-k");
}

// More entries than the kernel stages in shared memory: unsupported on CUDA, saying so.
TEST(GpuTopkColumns, TooWideATopkIsUnsupported) {
  SKIP_WITHOUT_GPU();
  std::vector<LayerSpec> specs = three_layers(2);
  specs[2].index_topk = 2052;
  StepCase c(specs, {.q_lens = {1}, .seq_lens = {9000}, .num_decodes = 1}, 3);
  DeviceMirror gpu;
  const AttentionLayer l = gpu(c.layers)[2];
  const CompressedColumns compressed = gpu(c.args(2)).compressed;
  SparseIndexArgs swa = swa_only(gpu(c.args(2)));
  swa.out = table_outputs(swa, [&](DType dtype, std::initializer_list<int64_t> shape) {
    return gpu.output(dtype, shape);
  });
  ASSERT_GT(compressed.topk_indices.size(1), 2048);
  const TensorView q = gpu(c.bf16(1, 1));
  const DecodeArgs args =
      topk_decode_args(l, swa, compressed, q, gpu.output(DType::bf16, {1, 1, kHeadDim}));
  try {
    sparse_mla_decode(args);
    ADD_FAILURE() << "a top-k of " << compressed.topk_indices.size(1) << " entries ran on CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
    EXPECT_EQ(e.argument(), "topk_columns.topk_indices") << e.what();
  }
}

}  // namespace
}  // namespace smla::test
