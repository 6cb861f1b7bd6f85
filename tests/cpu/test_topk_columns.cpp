// TopkColumns on the CPU: a decode reading its compressed columns from the top-k equals, bit for
// bit, the decode on the table build_sparse_indices makes from the same top-k — over decode and
// prefill rows, padding tokens, packed pages, every cache layout and top-k rows with -1 and -7 —
// and its arguments are checked by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "direct_call.h"
#include "error_check.h"
#include "ref_numeric.h"
#include "seed.h"
#include "step_case.h"

namespace smla::test {
namespace {

constexpr int kHeads = 3;

// What expect_equal_decodes compared (so that a test can see it checked something): the
// compressed columns the built tables attend, and the padding rows it filled.
struct Compared {
  int64_t attended = 0, padding_rows = 0;
};

// Both decodes of every compressed layer of `c` (a query of `query`): outputs and lse equal bit
// for bit, and no NaN. `fill_padding`: each padding token's SWA columns (all -1 as built) are
// hand-set to the first valid token's in both tables: a padding row's length is W either way
// (the tables', and TopkColumns' with is_valid_token 0), so both attend them.
Compared expect_equal_decodes(StepCase& c, DType query = DType::bf16, bool fill_padding = false) {
  const int64_t T = c.num_tokens();
  Compared compared;
  for (const AttentionLayer& l : c.layers) {
    if (l.spec.compress_ratio == 0) continue;
    auto make = [&](DType dtype, std::initializer_list<int64_t> shape) {
      return c.zeros(dtype, shape);
    };
    const SparseIndexArgs full = built(c.args(l.spec.layer), make);
    const SparseIndexArgs swa = built(swa_only(full), make);
    for (int64_t t = 0; t < T; ++t)
      compared.attended += full.out.sparse_topk_lens.ptr<const int32_t>()[t] - kWindow;
    const TensorView& valid = full.step.is_valid_token;
    if (fill_padding && valid.defined()) {
      const auto is_valid = [&](int64_t t) {
        return valid.ptr<const uint8_t>()[t * valid.stride(0)];
      };
      int64_t from = 0;
      while (from < T && !is_valid(from)) ++from;
      for (int64_t t = 0; t < T && from < T; ++t)
        if (!is_valid(t))
          for (const SparseIndexArgs* a : {&full, &swa}) {
            const TensorView& table = a->out.sparse_indices;
            int32_t* rows = table.ptr<int32_t>();
            std::copy_n(rows + from * table.stride(0), kWindow, rows + t * table.stride(0));
            compared.padding_rows += a == &full;
          }
    }

    const TensorView q = c.query(T, kHeads, query);
    TensorView outs[2], lses[2];
    for (int k = 0; k < 2; ++k) {  // poisoned differently: every element must be written
      outs[k] = c.bf16(T, kHeads);
      lses[k] = c.zeros(DType::f32, {T, kHeads});
      std::memset(lses[k].data, k ? 0xa5 : 0xff, T * kHeads * sizeof(float));
    }
    DecodeArgs table = direct_decode_args(l, full, q, outs[0]);
    DecodeArgs topk = topk_decode_args(l, swa, full.compressed, q, outs[1]);
    table.lse = lses[0];
    topk.lse = lses[1];
    sparse_mla_decode(table);
    sparse_mla_decode(topk);
    EXPECT_EQ(std::memcmp(outs[0].data, outs[1].data, T * kHeads * kHeadDim * 2), 0)
        << "layer " << l.spec.layer;
    EXPECT_EQ(std::memcmp(lses[0].data, lses[1].data, T * kHeads * sizeof(float)), 0)
        << "layer " << l.spec.layer;
    // Equal NaN (a row both read wrongly, or poison both left) is no pass either.
    EXPECT_FALSE(any_bf16_nan(outs[0].data, T * kHeads * kHeadDim * 2)) << "layer " << l.spec.layer;
    EXPECT_FALSE(any_f32_nan(lses[0].data, T * kHeads * sizeof(float))) << "layer " << l.spec.layer;
  }
  return compared;
}

// `layer`'s SWA-only table, built on the host.
SparseIndexArgs swa_table(StepCase& c, int layer) {
  return built(swa_only(c.args(layer)), [&](DType dtype, std::initializer_list<int64_t> shape) {
    return c.zeros(dtype, shape);
  });
}

std::vector<LayerSpec> layers_of(int ratio) {
  std::vector<LayerSpec> specs = three_layers(ratio);
  for (LayerSpec& s : specs) s.num_heads = kHeads;
  return specs;
}

TEST(TopkColumns, EqualTheBuiltTableBitForBit) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  int64_t attended = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const LayoutKind kind = kLayoutKinds[trial / 4 % std::size(kLayoutKinds)];
    CaseShape shape = random_shape(rng, trial);
    shape.layout = kind.layout;
    StepCase c(layers_of(1 + trial % 4), shape, rng());
    if (trial % 2) c.punch_topk_holes();
    attended += expect_equal_decodes(c, kind.query).attended;
  }
  EXPECT_GT(attended, 0);  // the compressed columns were there to compare
}

// A padding token's row is W long with TopkColumns too: SWA columns a caller's table gives it
// are read as the table's own length says.
TEST(TopkColumns, PaddingRowsReadTheirSwaColumns) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  int64_t filled = 0;
  // Four trials, and more while none had a padding row beside a valid one (a small step may not).
  for (int trial = 0; trial < 4 || (filled == 0 && trial < 64); ++trial) {
    CaseShape shape = random_shape(rng, trial);
    shape.invalid_fraction = 0.4;
    StepCase c(layers_of(1 + trial % 4), shape, rng());
    filled += expect_equal_decodes(c, DType::bf16, true).padding_rows;
  }
  EXPECT_GT(filled, 0);  // padding rows were there to compare
}

// A prefill row's table takes its first min((pos + 1) / ratio, top-k) entries, whatever the rest
// hold; step_case.h writes -1 there unless told otherwise, which would hide a decode that reads
// the rest. Here they are valid entries (topk_tails), which neither may attend in a prefill row
// and both must in a decode row.
TEST(TopkColumns, PrefillRowsReadOnlyTheirVisibleEntries) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 12; ++trial) {
    CaseShape shape = random_shape(rng, trial);
    shape.num_decodes = std::min<int>(shape.num_decodes, int(shape.q_lens.size()) - 1);
    shape.topk_tails = true;
    StepCase c(layers_of(1 + trial % 4), shape, rng());
    expect_equal_decodes(c);
  }
}

TEST(TopkColumns, AnEntryPastTheBlockTableIsTheBuildersError) {
  StepCase c(layers_of(2), {.q_lens = {1, 1}, .seq_lens = {300, 200}, .num_decodes = 2}, 5);
  const AttentionLayer& l = c.layers[2];
  const CompressedColumns compressed = c.args(l.spec.layer).compressed;
  const SparseIndexArgs swa = swa_table(c, l.spec.layer);
  compressed.topk_indices.ptr<int32_t>()[0] =
      static_cast<int32_t>(compressed.block_table.size(1) * 8);  // E = 8: one page too far
  const DecodeArgs args =
      topk_decode_args(l, swa, compressed, c.bf16(2, kHeads), c.bf16(2, kHeads));
  expect_smla_error([&] { sparse_mla_decode(args); }, ErrorKind::value, "topk_columns.topk_indices",
                    "block_table pages * E", "topk_indices[0][0] = ");
}

// A decode row's length counts its entries >= 0, so a valid entry after a negative one would
// lie past it, never attended (SPEC §4: valid ones first): the builder's error, and the decode's,
// before the entry is converted (here it is past the block table too).
TEST(TopkColumns, AValidEntryAfterANegativeOneIsTheBuildersErrorToo) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  // Ratio 2, top-k 30: a KV length below 60 sees seq_len / 2 entries, fewer than the top-k holds.
  const int seq_len = std::uniform_int_distribution<int>(4, 58)(rng);
  StepCase c(layers_of(2), {.q_lens = {1, 1}, .seq_lens = {seq_len, 200}, .num_decodes = 2},
             rng());
  const AttentionLayer& l = c.layers[2];
  const CompressedColumns compressed = c.args(l.spec.layer).compressed;
  const SparseIndexArgs swa = swa_table(c, l.spec.layer);
  int32_t* x = compressed.topk_indices.ptr<int32_t>();
  const int visible = seq_len / 2;
  ASSERT_TRUE(x[visible - 1] >= 0 && x[visible] == -1) << "seq_len " << seq_len;
  const int hole = std::uniform_int_distribution<int>(0, visible - 1)(rng);
  x[hole] = -1;
  x[visible] = static_cast<int32_t>(compressed.block_table.size(1) * 8);  // E = 8: past the table
  const std::string got = "topk_indices[0][" + std::to_string(hole + 1) +
                          "] = " + std::to_string(x[hole + 1]) + " after [" + std::to_string(hole) +
                          "] = -1";
  expect_smla_error(
      [&] {
        built(c.args(l.spec.layer), [&](DType dtype, std::initializer_list<int64_t> shape) {
          return c.zeros(dtype, shape);
        });
      },
      ErrorKind::value, "topk_indices", "the valid ones (>= 0) first", got);
  const DecodeArgs args =
      topk_decode_args(l, swa, compressed, c.bf16(2, kHeads), c.bf16(2, kHeads));
  expect_smla_error([&] { sparse_mla_decode(args); }, ErrorKind::value, "topk_columns.topk_indices",
                    "the valid ones (>= 0) first", got);
}

TEST(TopkColumns, ArgumentsAreCheckedByName) {
  StepCase c(layers_of(2), {.q_lens = {1, 2}, .seq_lens = {300, 200}, .num_decodes = 2}, 6);
  const AttentionLayer& l = c.layers[2];
  const CompressedColumns compressed = c.args(l.spec.layer).compressed;
  const SparseIndexArgs swa = swa_table(c, l.spec.layer);
  const DecodeArgs good =
      topk_decode_args(l, swa, compressed, c.bf16(3, kHeads), c.bf16(3, kHeads));
  sparse_mla_decode(good);

  auto expect = [&](auto change, const char* argument, const char* expected, const char* got) {
    DecodeArgs a = good;
    change(a);
    expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::value, argument, expected, got);
  };
  expect([&](DecodeArgs& a) { a.sparse_topk_lens = swa.out.sparse_topk_lens; }, "sparse_topk_lens",
         "absent with topk_columns", "[3]");
  expect([](DecodeArgs& a) { a.topk_columns.compress_ratio = 0; }, "topk_columns.compress_ratio",
         ">= 1", "0");
  expect([](DecodeArgs& a) { a.topk_columns.num_decodes = 3; }, "topk_columns.num_decodes",
         "0..B = 2", "3");
  expect([](DecodeArgs& a) { a.topk_columns.num_decodes = -1; }, "topk_columns.num_decodes",
         "0..B = 2", "-1");
  expect([](DecodeArgs& a) { a.topk_columns.block_table.shape[0] = 1; }, "topk_columns.block_table",
         "[>= B=2, pages]", "[1, ");
  expect([](DecodeArgs& a) { a.topk_columns.topk_indices.shape[0] = 2; },
         "topk_columns.topk_indices", "[T=3, top_k]", "[2, ");
  const TensorView two_flags = c.zeros(DType::u8, {2});
  expect([&](DecodeArgs& a) { a.topk_columns.is_valid_token = two_flags; },
         "topk_columns.is_valid_token", "[T=3]", "[2]");
  expect([](DecodeArgs& a) { a.sparse_indices.shape[1] = 64; }, "sparse_indices",
         "K >= window = 128", "[3, 64]");
  // Without the top-k the op would read the table's lengths and no compressed column: any other
  // field set names the missing top-k.
  const auto without_topk = [&](auto change, const char* field) {
    expect(
        [&](DecodeArgs& a) {
          const TopkColumns given = a.topk_columns;
          a.topk_columns = {};
          a.sparse_topk_lens = swa.out.sparse_topk_lens;
          change(a.topk_columns, given);
        },
        "topk_columns.topk_indices", field, "absent");
  };
  without_topk([](TopkColumns& t, const TopkColumns& g) { t.block_table = g.block_table; },
               "as topk_columns.block_table is given");
  without_topk(
      [&](TopkColumns& t, const TopkColumns&) { t.is_valid_token = c.zeros(DType::u8, {3}); },
      "as topk_columns.is_valid_token is given");
  without_topk([](TopkColumns& t, const TopkColumns&) { t.compress_ratio = 4; },
               "as topk_columns.compress_ratio is given");
  without_topk([](TopkColumns& t, const TopkColumns&) { t.num_decodes = 1; },
               "as topk_columns.num_decodes is given");
  // Inputs only the top-k reads are apart from the outputs too: each moved into out's memory.
  for (const auto& [field, name] :
       {std::pair{&TopkColumns::topk_indices, "topk_columns.topk_indices"},
        std::pair{&TopkColumns::block_table, "topk_columns.block_table"}}) {
    DecodeArgs a = good;
    TensorView& input = a.topk_columns.*field;
    ASSERT_TRUE(input.is_contiguous());
    ASSERT_LE(input.numel() * 4, a.out.numel() * 2);
    std::memcpy(a.out.data, input.data, static_cast<size_t>(input.numel()) * 4);
    input.data = a.out.data;
    expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::value, "out",
                      std::string("memory apart from ") + name,
                      std::string("an overlap with ") + name);
  }
  // The mask too, where given: ones (every token valid) in out's first bytes.
  {
    DecodeArgs a = good;
    ASSERT_FALSE(a.topk_columns.is_valid_token.defined());
    std::memset(a.out.data, 1, 3);
    a.topk_columns.is_valid_token = make_view(a.out.data, DType::u8, Device{}, {3});
    expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::value, "out",
                      "memory apart from topk_columns.is_valid_token",
                      "an overlap with topk_columns.is_valid_token");
  }
  // sparse_topk_lens, refused with the top-k before any check reads it, is quoted by the dims
  // its view holds (4 here, its ndim past them): not read past its shape.
  expect([&](DecodeArgs& a) { (a.sparse_topk_lens = swa.out.sparse_topk_lens).ndim = 5; },
         "sparse_topk_lens", "absent with topk_columns", "[3, 0, 0, 0]");
  DecodeArgs table = good;
  table.topk_columns = {};
  table.sparse_topk_lens = swa.out.sparse_topk_lens;
  EXPECT_NO_THROW(sparse_mla_decode(table));  // none set: the SWA table alone
  // A K = W + top_k (rounded up to 4) past 2^31 - 32 is unsupported: 2^31 - 28, one step past,
  // and one where top_k alone is below 2^31 - 32 but W + top_k is not.
  for (const int64_t top_k : {int64_t(INT32_MAX) - 27 - good.window, int64_t(INT32_MAX) - 64}) {
    DecodeArgs a = good;
    a.topk_columns.topk_indices =
        make_view(good.topk_columns.topk_indices.data, DType::i32, Device{}, {3, top_k}, {0, 1});
    expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::unsupported,
                      "topk_columns.topk_indices", "<= 2^31 - 32",
                      "[3, " + std::to_string(top_k) + "]");
  }
}

}  // namespace
}  // namespace smla::test
