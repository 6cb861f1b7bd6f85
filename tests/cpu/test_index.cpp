// The index builders (SPEC §4): hand-computed rows, then random steps against a plain
// re-derivation of the rules, written here without the library's structure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_gen.h"
#include "core/index_problem.h"
#include "cpu/index.h"
#include "error_check.h"
#include "smla/error.h"
#include "smla/index.h"
#include "step_case.h"
#include "threads_env.h"

namespace smla {
namespace {

using Rows = std::vector<std::vector<int32_t>>;

struct Built {
  Rows indices{};
  std::vector<int32_t> lens{}, seq_lens{};
};

// A pool of this geometry. The builders read only its shape and strides, but the overlap checks
// compare its extent with the outputs': it spans memory of its own (over a 2-byte buffer it
// reached the heap, and two tests failed with an overlap wherever the heap followed it).
TensorView pool_view(int64_t blocks, int64_t block_size, int64_t span) {
  static std::vector<uint16_t> data(size_t{1} << 19);
  const int64_t extent = ((blocks - 1) * span + block_size) * kHeadDim;
  if (extent > static_cast<int64_t>(data.size()))
    throw std::length_error("pool_view: " + std::to_string(extent) + " elements, past its buffer");
  return make_view(data.data(), DType::bf16, Device{}, {blocks, block_size, kHeadDim},
                   {span * kHeadDim, kHeadDim, 1});
}

TensorView i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return make_view(v.data(), DType::i32, Device{}, shape);
}

// Runs the builder into outputs sized by sparse_index_columns, poisoned with a value past every
// pool's rows and every length here.
Built build(SparseIndexArgs a) {
  const int64_t T = a.step.num_tokens;
  const int64_t K = sparse_index_columns(a);
  constexpr int32_t kPoison = 0x7eadbeef;
  std::vector<int32_t> indices(T * K, kPoison), lens(T, kPoison), seq_lens(T, kPoison);
  a.out.sparse_indices = i32(indices, {T, K});
  a.out.sparse_topk_lens = i32(lens, {T});
  if (a.step.decode_swa_width > a.window) a.out.seq_lens = i32(seq_lens, {T});
  build_sparse_indices(a);
  Built b{.lens = lens};
  for (int64_t t = 0; t < T; ++t)  // iterators: indices[T * K] would index past the vector
    b.indices.emplace_back(indices.begin() + t * K, indices.begin() + (t + 1) * K);
  if (a.out.seq_lens.defined()) b.seq_lens = seq_lens;
  return b;
}

// The argument an smla::Error names, or "" when `f` does not throw one.
template <class F>
std::string error_argument(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.argument();
  }
  return "";
}

TEST(IndexColumns, WidthRules) {
  EXPECT_EQ(sparse_index_columns(128, 0, 0), 128);
  EXPECT_EQ(sparse_index_columns(128, 512, 0), 640);
  EXPECT_EQ(sparse_index_columns(128, 33, 0), 164);   // top-k rounded up to 4
  EXPECT_EQ(sparse_index_columns(128, 0, 128), 128);  // not wider than W: causal
  EXPECT_EQ(sparse_index_columns(128, 512, 128), 640);  // causal keeps the top-k columns
  EXPECT_EQ(sparse_index_columns(128, 33, 127), 164);
  EXPECT_EQ(sparse_index_columns(128, 0, 192), 192);
  EXPECT_EQ(dspark_swa_width(128, 1), 192);
  EXPECT_EQ(dspark_swa_width(128, 64), 192);
  EXPECT_EQ(dspark_swa_width(128, 65), 256);
  EXPECT_EQ(dspark_swa_width(128, 0), 128);
  test::expect_smla_error([] { dspark_swa_width(-500, 1); }, ErrorKind::value, "window", ">= 1",
                    "-500");
  // 0 is the first window refused, by both rules.
  test::expect_smla_error([] { dspark_swa_width(0, 1); }, ErrorKind::value, "window", ">= 1", "0");
  test::expect_smla_error([] { sparse_index_columns(0, 4, 0); }, ErrorKind::value, "window", ">= 1",
                          "0");
  test::expect_smla_error([] { dspark_swa_width(INT32_MAX - 10, 100); }, ErrorKind::value,
                    "num_draft_tokens", "2^31", "100");
  // The widest that is an int, then the first width of 2^31 exactly.
  EXPECT_EQ(dspark_swa_width(INT32_MAX - 127, 64), INT32_MAX - 63);
  test::expect_smla_error([] { dspark_swa_width(INT32_MAX - 63, 1); }, ErrorKind::value,
                          "num_draft_tokens", "2^31 - 64", "1");
  test::expect_smla_error([] { dspark_swa_width(128, -200); }, ErrorKind::value, "num_draft_tokens",
                          ">= 0", "-200");
  test::expect_smla_error([] { sparse_index_columns(-128, 4, 0); }, ErrorKind::value, "window",
                          ">= 1", "-128");
  test::expect_smla_error([] { sparse_index_columns(128, -4, 0); }, ErrorKind::value, "top_k",
                          "0..2^31 - 1", "-4");
  test::expect_smla_error([] { sparse_index_columns(128, int64_t(1) << 31, 0); },
                          ErrorKind::value, "top_k", "0..2^31 - 1", "2147483648");
  test::expect_smla_error([] { sparse_index_columns(128, 4, -4); }, ErrorKind::value,
                          "decode_swa_width", "0..2^31 - 1", "-4");
  // A DSpark width the builder would refuse is refused here, where buffers are sized.
  test::expect_smla_error([] { sparse_index_columns(128, 0, 129); }, ErrorKind::value,
                          "decode_swa_width", "a multiple of 4", "129");
  test::expect_smla_error([] { sparse_index_columns(128, 512, 132); }, ErrorKind::value, "top_k",
                          "SWA-only", "512");
}

// K from a layer's topk_indices view (only its shape is read): up to 2^31 - 1 columns, W + top_k
// rounded up to 4 past it refused by name, and no compressed columns without a ratio.
TEST(IndexColumns, WidthOfTheTableTheArgsDescribe) {
  SparseIndexArgs a;
  a.window = 3;
  a.compressed.compress_ratio = 4;
  a.compressed.topk_indices = make_view(nullptr, DType::i32, Device{}, {1, INT32_MAX - 3});
  EXPECT_EQ(sparse_index_columns(a), INT32_MAX);  // 3 + (2^31 - 4): the widest table
  a.compressed.compress_ratio = 0;  // an SWA-only layer ignores its compressed columns
  EXPECT_EQ(sparse_index_columns(a), 3);
  a.compressed.compress_ratio = 4;
  a.window = 128;
  for (const auto& [top_k, got] : {std::pair<int64_t, const char*>{INT32_MAX, "2147483776 columns"},
                                   {int64_t(1) << 31, "2147483648 columns"}}) {
    a.compressed.topk_indices.shape[1] = top_k;
    test::expect_smla_error([&] { sparse_index_columns(a); }, ErrorKind::value, "topk_indices",
                            "W + top_k < 2^31", got);
  }
  // The args' own names: a negative width is topk_indices', a ratio the build refuses its own.
  a.compressed.topk_indices.shape[1] = -8;
  test::expect_smla_error([&] { sparse_index_columns(a); }, ErrorKind::value, "topk_indices",
                          "non-negative sizes", "[1, -8]");
  a.compressed.topk_indices.shape[1] = 8;
  a.compressed.compress_ratio = -4;
  test::expect_smla_error([&] { sparse_index_columns(a); }, ErrorKind::value, "compress_ratio",
                          ">= 0", "-4");
  a.compressed.compress_ratio = 4;
  a.step.decode_swa_width = 192;
  test::expect_smla_error([&] { sparse_index_columns(a); }, ErrorKind::value, "compress_ratio",
                          "SWA-only", "4");
}

// W = 4, SWA pages of 4 rows packed with a stride of 6 rows.
struct SwaOnlyCase {
  std::vector<int32_t> seq_lens{3, 6}, cum{0, 1, 3}, block_table{5, 1, 2, 7};
  std::vector<uint8_t> valid{1, 1, 1};
  SparseIndexArgs args() {
    SparseIndexArgs a;
    a.window = 4;
    a.step = {.num_tokens = 3,
              .seq_lens = i32(seq_lens, {2}),
              .cum_seq_lens_q = i32(cum, {3}),
              .num_decodes = 2,
              .max_q_len = 2};
    a.step.is_valid_token = make_view(valid.data(), DType::u8, Device{}, {3});
    a.swa = {i32(block_table, {2, 2}), pool_view(8, 4, 6)};
    return a;
  }
};

TEST(IndexDecode, SwaWindowOnPackedPages) {
  SwaOnlyCase c;
  const Built b = build(c.args());
  // Token 0: request 0 at pos 2 sees 0..2 on page 5 (rows 30..32 with span 6).
  // Tokens 1, 2: request 1 at pos 4, 5; positions 0..3 on page 2 (12..15), 4..7 on page 7 (42..).
  EXPECT_EQ(b.indices, (Rows{{30, 31, 32, -1}, {13, 14, 15, 42}, {14, 15, 42, 43}}));
  EXPECT_EQ(b.lens, (std::vector<int32_t>{4, 4, 4}));
}

// The mask read at its stride too (2: every other byte, those between saying the opposite);
// any nonzero byte is a valid token, 0 alone padding.
TEST(IndexDecode, InvalidTokenIsPadding) {
  for (const int64_t stride : {1, 2}) {
    SwaOnlyCase c;
    c.valid =
        stride == 1 ? std::vector<uint8_t>{2, 0, 255} : std::vector<uint8_t>{1, 0, 0, 7, 1, 0};
    SparseIndexArgs a = c.args();
    a.step.is_valid_token = make_view(c.valid.data(), DType::u8, Device{}, {3}, {stride});
    const Built b = build(a);
    EXPECT_EQ(b.indices, (Rows{{30, 31, 32, -1}, {-1, -1, -1, -1}, {14, 15, 42, 43}})) << stride;
    EXPECT_EQ(b.lens, (std::vector<int32_t>{4, 4, 4})) << stride;
  }
}

TEST(IndexDecode, NegativeSlotsStay) {
  // An evicted page (-1) gives negative slots, which are not rewritten.
  std::vector<int32_t> seq_lens{6}, block_table{-1, 3};
  SparseIndexArgs a;
  a.window = 4;
  a.step = {.num_tokens = 1, .seq_lens = i32(seq_lens, {1}), .num_decodes = 1};
  a.swa = {i32(block_table, {1, 2}), pool_view(4, 4, 6)};
  EXPECT_EQ(build(a).indices, (Rows{{-2, -1, 18, 19}}));
}

// A page id far below 0 (INT32_MIN): page * 4 + i lies below INT32_MIN, where int32 would wrap
// it to i, a real row; it stays negative (INT32_MIN), padding. Positions 2..5, pages of 4 rows.
TEST(IndexDecode, NegativeSlotsBelowInt32StayNegative) {
  std::vector<int32_t> seq_lens{6}, block_table{INT32_MIN, 3};
  SparseIndexArgs a;
  a.window = 4;
  a.step = {.num_tokens = 1, .seq_lens = i32(seq_lens, {1}), .num_decodes = 1};
  a.swa = {i32(block_table, {1, 2}), pool_view(4, 4, 6)};
  EXPECT_EQ(build(a).indices, (Rows{{INT32_MIN, INT32_MIN, 18, 19}}));
}

// An offset past INT32_MAX addresses no pool: -1, not the int32 it wraps to. Pages of 64 rows:
// page 2^25 - 1 ends at offset 2^31 - 1, page 2^26 starts at 2^32 (which wraps to 0).
TEST(IndexDecode, OffsetPastInt32IsPadding) {
  std::vector<int32_t> seq_lens{66}, block_table{(1 << 25) - 1, 1 << 26};
  SparseIndexArgs a;
  a.window = 4;
  a.step = {.num_tokens = 1, .seq_lens = i32(seq_lens, {1}), .num_decodes = 1};
  a.swa = {i32(block_table, {1, 2}), pool_view(4, 64, 64)};
  EXPECT_EQ(build(a).indices, (Rows{{INT32_MAX - 1, INT32_MAX, -1, -1}}));  // positions 62..65
}

// An fp8_ds_mla pool's offsets are plain slots whatever its page stride (SPEC §2: here 65 x 576
// B for 64 records and their scales, where §4's span = block stride / token stride would be
// 65): positions 62..69 on pages 2 and 3 are slots 190..197.
TEST(IndexDecode, DsMlaPoolOffsetsArePlainSlots) {
  static std::vector<uint8_t> pool(4 * 65 * 576);
  std::vector<int32_t> seq_lens{70}, block_table{2, 3};
  SparseIndexArgs a;
  a.window = 8;
  a.step = {.num_tokens = 1, .seq_lens = i32(seq_lens, {1}), .num_decodes = 1};
  a.swa = {i32(block_table, {1, 2}),
           make_view(pool.data(), DType::u8, Device{}, {4, 64, 584}, {65 * 576, 584, 1})};
  EXPECT_EQ(build(a).indices, (Rows{{190, 191, 192, 193, 194, 195, 196, 197}}));
}

// W = 4, ratio 2, top_k 3 (P = 4). Request 0 decodes 1 token, request 1 prefills 5.
// SWA pages: 4 rows, unpacked. Compressed pages: E = 2 entries, stride 3 rows.
struct MixedCase {
  std::vector<int32_t> seq_lens{5, 5}, cum{0, 1, 6}, block_table{0, 1, 2, 6},
      compressed_table{3, 0, 1, 4};
  std::vector<int32_t> topk{1, 0, -1,  // decode: -1 padded
                            9, 9, 9,   // pos 0 sees no compressed entry: nothing read
                            1, 9, 9,   // pos 1: one entry
                            0, 9, 9,   // pos 2: one
                            1, 0, 9,   // pos 3: two
                            2, 1, 9};  // pos 4: two
  SparseIndexArgs args() {
    SparseIndexArgs a;
    a.window = 4;
    a.step = {.num_tokens = 6,
              .seq_lens = i32(seq_lens, {2}),
              .cum_seq_lens_q = i32(cum, {3}),
              .num_decodes = 1,
              .max_q_len = 5};
    a.swa = {i32(block_table, {2, 2}), pool_view(8, 4, 4)};
    a.compressed = {2, i32(topk, {6, 3}), i32(compressed_table, {2, 2}), pool_view(5, 2, 3)};
    return a;
  }
};

TEST(IndexMixed, DecodeThenPrefillRows) {
  MixedCase c;
  const Built b = build(c.args());
  // Decode token: x = 1 -> page 3 slot 7 -> row 10; x = 0 -> slot 6 -> row 9.
  // Prefill: x = 0, 1 on page 1 -> rows 3, 4; x = 2 on page 4 -> slot 8 -> row 12.
  EXPECT_EQ(b.indices, (Rows{{1, 2, 3, 4, 10, 9, -1, -1},
                             {8, -1, -1, -1, -1, -1, -1, -1},
                             {8, 9, -1, -1, 4, -1, -1, -1},
                             {8, 9, 10, -1, 3, -1, -1, -1},
                             {8, 9, 10, 11, 4, 3, -1, -1},
                             {9, 10, 11, 24, 12, 4, -1, -1}}));
  EXPECT_EQ(b.lens, (std::vector<int32_t>{6, 4, 5, 5, 6, 6}));
}

TEST(IndexMixed, DecodeCountsOnlyNonNegativeTopk) {
  MixedCase c;
  c.topk[1] = -5;  // a negative index stays as it is and is not counted
  const Built b = build(c.args());
  EXPECT_EQ(b.indices[0], (std::vector<int32_t>{1, 2, 3, 4, 10, -5, -1, -1}));
  EXPECT_EQ(b.lens[0], 5);
}

// A decode row's length counts its entries >= 0 (SPEC §4: valid ones first), so one after a
// negative entry would lie past the length, never attended: refused on the host.
TEST(IndexMixed, DecodeTopkWithAValidEntryAfterANegativeOneIsRefused) {
  for (int32_t negative : {-1, -5}) {
    MixedCase c;
    c.topk[0] = negative;  // then topk[1] = 0
    test::expect_smla_error([&] { build(c.args()); }, ErrorKind::value, "topk_indices",
                            "the valid ones (>= 0) first",
                            "topk_indices[0][1] = 0 after [0] = " + std::to_string(negative));
  }
  MixedCase c;  // the message shows the first padded entry, not the one before the valid one
  c.topk[0] = -1, c.topk[1] = -5, c.topk[2] = 0;
  test::expect_smla_error([&] { build(c.args()); }, ErrorKind::value, "topk_indices",
                          "the valid ones (>= 0) first", "topk_indices[0][2] = 0 after [0] = -1");
}

// A prefill row's length is its visible entries, min((pos + 1) / ratio, top_k), -1 or not (a
// decode row counts only the non-negative ones, above).
TEST(IndexMixed, PrefillLengthCountsPaddedEntries) {
  MixedCase c;
  c.topk[12] = -1;  // pos 3's first entry
  const Built b = build(c.args());
  EXPECT_EQ(b.indices[4], (std::vector<int32_t>{8, 9, 10, 11, -1, 3, -1, -1}));
  EXPECT_EQ(b.lens[4], 6);
}

// The same for a top-k entry's offset (E = 64 entries a page, unpacked): x = 5 on page 2^26 is
// past INT32_MAX and becomes -1; x = 70 and 127 on page 2^25 - 1 are at most INT32_MAX. The
// decode row still counts every x >= 0 (SPEC §4: count(x >= 0)).
TEST(IndexMixed, TopkOffsetPastInt32IsPadding) {
  std::vector<int32_t> seq_lens{3}, block_table{1}, compressed_table{1 << 26, (1 << 25) - 1},
      topk{5, 70, 127, -1};
  SparseIndexArgs a;
  a.window = 4;
  a.step = {.num_tokens = 1, .seq_lens = i32(seq_lens, {1}), .num_decodes = 1};
  a.swa = {i32(block_table, {1, 1}), pool_view(2, 4, 4)};
  a.compressed = {4, i32(topk, {1, 4}), i32(compressed_table, {1, 2}), pool_view(2, 64, 64)};
  const Built b = build(a);
  EXPECT_EQ(b.indices, (Rows{{4, 5, 6, -1, -1, INT32_MAX - 57, INT32_MAX, -1}}));
  EXPECT_EQ(b.lens, (std::vector<int32_t>{7}));
}

// Ratio 0 is SWA-only whatever the compressed columns hold (CompressedColumns: ignored).
TEST(IndexMixed, SwaOnlyLayerOfTheSameStep) {
  for (const bool stray_columns : {false, true}) {
    MixedCase c;
    SparseIndexArgs a = c.args();
    if (stray_columns)
      a.compressed.compress_ratio = 0;
    else
      a.compressed = {};
    const Built b = build(a);
    EXPECT_EQ(b.indices, (Rows{{1, 2, 3, 4},
                               {8, -1, -1, -1},
                               {8, 9, -1, -1},
                               {8, 9, 10, -1},
                               {8, 9, 10, 11},
                               {9, 10, 11, 24}}));
    EXPECT_EQ(b.lens, (std::vector<int32_t>(6, 4)));
  }
}

// W = 4, 3 draft tokens: rows of 64. Request 0: seq_len 10, q_len 3 sees [3, 10);
// request 1: seq_len 2, q_len 1 sees [0, 2).
struct DsparkCase {
  std::vector<int32_t> seq_lens{10, 2}, cum{0, 3, 4}, block_table{2, 0, 1, 3, 9, 9};
  SparseIndexArgs args() {
    SparseIndexArgs a;
    a.window = 4;
    a.step = {.num_tokens = 4,
              .seq_lens = i32(seq_lens, {2}),
              .cum_seq_lens_q = i32(cum, {3}),
              .num_decodes = 2,
              .max_q_len = 3,
              .decode_swa_width = dspark_swa_width(4, 3)};
    a.swa = {i32(block_table, {2, 3}), pool_view(10, 4, 4)};
    return a;
  }
};

TEST(IndexDspark, NonCausalWindowPerToken) {
  DsparkCase c;
  const Built b = build(c.args());
  auto row = [](std::vector<int32_t> head) {
    head.resize(64, -1);
    return head;
  };
  const std::vector<int32_t> draft = row({11, 0, 1, 2, 3, 4, 5});
  EXPECT_EQ(b.indices, (Rows{draft, draft, draft, row({12, 13})}));
  EXPECT_EQ(b.lens, (std::vector<int32_t>{7, 7, 7, 4}));  // max(window len, W)
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{10, 10, 10, 2}));
}

// The backend reads the step's values again after validate_index checked them. Values changed
// in between (by another thread: a race the caller owns) may throw or give wrong rows, but every
// write stays inside the outputs: guard words before and after them stay as they were.
TEST(IndexDecode, StepValuesChangedAfterValidationWriteOnlyTheOutputs) {
  struct Change {
    const char* what;
    std::vector<int32_t> seq_lens, cum;
  };
  const auto check = [](auto& c, const Change& change) {
    SCOPED_TRACE(change.what);
    SparseIndexArgs a = c.args();
    const int64_t T = a.step.num_tokens, K = sparse_index_columns(a), kGuard = 256;
    constexpr int32_t kPoison = 0x7eadbeef;
    std::vector<int32_t> memory(3 * kGuard + T * K + 2 * T, kPoison);
    int32_t* indices = memory.data() + kGuard;
    int32_t* lens = indices + T * K + kGuard;
    a.out.sparse_indices = make_view(indices, DType::i32, Device{}, {T, K});
    a.out.sparse_topk_lens = make_view(lens, DType::i32, Device{}, {T});
    if (a.step.decode_swa_width > a.window)
      a.out.seq_lens = make_view(lens + T, DType::i32, Device{}, {T});
    const IndexProblem problem = validate_index(a);
    c.seq_lens = change.seq_lens, c.cum = change.cum;  // same sizes: the views still see them
    try {
      cpu::build_sparse_indices(problem, a);
    } catch (const Error&) {  // a page past the block table: refused, as it should be
    }
    const auto intact = [&](const int32_t* from, int64_t n) {
      return std::all_of(from, from + n, [&](int32_t x) { return x == kPoison; });
    };
    EXPECT_TRUE(intact(memory.data(), kGuard)) << "written before the indices";
    EXPECT_TRUE(intact(indices + T * K, kGuard)) << "written between indices and lengths";
    EXPECT_TRUE(intact(lens + 2 * T, kGuard)) << "written after the lengths";
  };
  for (const Change& change :
       {Change{"cum reversed", {3, 6}, {0, 3, 1}}, Change{"cum past T", {3, 6}, {0, 1 << 20, 3}},
        Change{"seq_len negative", {-100, 6}, {0, 1, 3}},
        Change{"seq_len past the table", {3, 1 << 20}, {0, 1, 3}}}) {
    SwaOnlyCase c;
    check(c, change);
  }
  // DSpark: a draft block grown past the row (K = 64 columns, q_len 60 + W).
  for (const Change& change : {Change{"draft block past K", {70, 2}, {0, 60, 4}},
                               Change{"seq_len negative", {-50, 2}, {0, 3, 4}}}) {
    DsparkCase c;
    c.block_table = std::vector<int32_t>(c.block_table.size(), 0);
    check(c, change);
  }
}

// A negative DSpark width is not a way to say "causal" (0..W is): refused, naming it.
TEST(IndexErrors, NegativeDecodeSwaWidth) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(3 * 4), lens(3);
  a.out = {i32(indices, {3, 4}), i32(lens, {3}), {}};
  a.step.decode_swa_width = -1;
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "decode_swa_width",
                          "0..2^31 - 1", "-1");
}

// Outputs may not share memory with each other or with the inputs: the builder's threads (or a
// kernel's) would race on it, and lengths would land in the offsets.
TEST(IndexErrors, OutputsApartFromEachOtherAndTheInputs) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(3 * 4), lens(3);
  a.out = {i32(indices, {3, 4}), i32(lens, {3}), {}};
  ASSERT_NO_THROW(build_sparse_indices(a));
  a.out.sparse_topk_lens = make_view(indices.data(), DType::i32, Device{}, {3}, {4});  // column 0
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_indices",
                          "memory apart from sparse_topk_lens", "an overlap with sparse_topk_lens");
  a.out.sparse_topk_lens = i32(lens, {3});
  std::copy(c.block_table.begin(), c.block_table.end(), indices.begin());
  a.swa.block_table = i32(indices, {2, 2});  // the block table in the output's first row
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_indices",
                          "memory apart from block_table", "an overlap with block_table");
  a.swa.block_table = i32(c.block_table, {2, 2});
  // A pool is only read for its geometry, but writing over its rows would corrupt the cache.
  std::vector<uint16_t> rows(4 * 6 * kHeadDim);
  a.swa.swa_kv_cache =
      make_view(rows.data(), DType::bf16, Device{}, {4, 4, kHeadDim}, {6 * kHeadDim, kHeadDim, 1});
  a.out.sparse_indices = make_view(rows.data() + 2 * kHeadDim, DType::i32, Device{}, {3, 4});
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_indices",
                          "memory apart from swa_kv_cache", "an overlap with swa_kv_cache");
  a.out.sparse_indices = i32(indices, {3, 4});
  a.swa.swa_kv_cache = c.args().swa.swa_kv_cache;
  a.out.sparse_topk_lens = make_view(c.seq_lens.data(), DType::i32, Device{}, {2}, {1});
  a.out.sparse_topk_lens.shape[0] = 3;  // seq_lens and one more
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_topk_lens",
                          "memory apart from seq_lens", "an overlap with seq_lens");
  // Columns of one [T, K + 1] buffer share no element: the table, then its lengths.
  std::vector<int32_t> both(3 * 5, -7);
  a.out = {make_view(both.data(), DType::i32, Device{}, {3, 4}, {5, 1}),
           make_view(both.data() + 4, DType::i32, Device{}, {3}, {5}), {}};
  build_sparse_indices(a);
  EXPECT_EQ(both, (std::vector<int32_t>{30, 31, 32, -1, 4, 13, 14, 15, 42, 4, 14, 15, 42, 43, 4}));
}

TEST(IndexErrors, NameTheArgument) {
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              SparseIndexArgs a = c.args();
              a.swa.swa_kv_cache = make_view(c.seq_lens.data(), DType::bf16, Device{},
                                             {8, 4, kHeadDim}, {4 * kHeadDim + 100, kHeadDim, 1});
              build(a);
            }),
            "swa_kv_cache");  // a non-integral span
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              SparseIndexArgs a = c.args();
              std::vector<int32_t> out(3 * 8), lens(3);
              a.out = {i32(out, {3, 8}), i32(lens, {3}), {}};
              build_sparse_indices(a);
            }),
            "sparse_indices");  // K must be W + P
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              c.seq_lens[1] = 9;  // position 8 needs a third page
              build(c.args());
            }),
            "block_table");
  EXPECT_EQ(error_argument([] {
              MixedCase c;
              c.topk[1] = 4;  // page 2 of a 2-page compressed block table
              build(c.args());
            }),
            "topk_indices");
  EXPECT_EQ(error_argument([] {
              MixedCase c;
              SparseIndexArgs a = c.args();
              a.step.decode_swa_width = 64;
              build(a);
            }),
            "compress_ratio");  // DSpark is for SWA-only layers
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              c.seq_lens[1] = 1;  // below its q_len of 2
              build(c.args());
            }),
            "seq_lens");
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              c.cum[2] = 2;
              build(c.args());
            }),
            "cum_seq_lens_q");
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              SparseIndexArgs a = c.args();
              a.swa.block_table.device = {DeviceKind::cuda, 0};
              build(a);
            }),
            "block_table");
  EXPECT_EQ(error_argument([] {
              MixedCase c;
              SparseIndexArgs a = c.args();
              a.compressed.topk_indices.shape[0] = 5;
              build(a);
            }),
            "topk_indices");
  EXPECT_EQ(error_argument([] {
              SwaOnlyCase c;
              SparseIndexArgs a = c.args();
              std::vector<int32_t> out(3 * 4), lens(3), seq(3);
              a.out = {i32(out, {3, 4}), i32(lens, {3}), i32(seq, {3})};
              build_sparse_indices(a);
            }),
            "out.seq_lens");  // written by the DSpark window only
  // The builder's own checks, reached without sparse_index_columns sizing the outputs first.
  using Spoil = void (*)(SparseIndexArgs&);
  for (const auto& spoiled : std::vector<std::pair<Spoil, std::string>>{
           {[](SparseIndexArgs& a) { a.window = 0; }, "window"},
           {[](SparseIndexArgs& a) { a.compressed.compress_ratio = -1; }, "compress_ratio"}}) {
    EXPECT_EQ(error_argument([spoil = spoiled.first] {
                SwaOnlyCase c;
                SparseIndexArgs a = c.args();
                std::vector<int32_t> out(3 * 4), lens(3);
                a.out = {i32(out, {3, 4}), i32(lens, {3}), {}};
                spoil(a);
                build_sparse_indices(a);
              }),
              spoiled.second);
  }
  // A rank past the view's arrays is named, not read: the message describes the view without
  // its shape (it once printed 40 "sizes" read past shape[], or crashed at 2000).
  for (const int ndim : {5, 40, 2000}) {
    SwaOnlyCase c;
    SparseIndexArgs a = c.args();
    std::vector<int32_t> out(3 * 4), lens(3), seq(3);
    a.out = {i32(out, {3, 4}), i32(lens, {3}), i32(seq, {3})};
    a.out.seq_lens.ndim = ndim;
    test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "out.seq_lens",
                            "absent", "i32 of " + std::to_string(ndim) + " dims cpu");
  }
}

// The step's views and the outputs' are checked before any is read or written, each named:
// a mask of the wrong length or dtype, seq_lens of B != T with no cum_seq_lens_q (one request
// a token), a pool on another device, and outputs whose elements overlap.
TEST(IndexErrors, StepAndOutputViewsNameTheArgument) {
  const auto refused = [](auto&& spoil) {
    SwaOnlyCase c;
    SparseIndexArgs a = c.args();
    spoil(a);
    return error_argument([&] { build(a); });
  };
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.step.is_valid_token.shape[0] = 2; }),
            "is_valid_token");
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.step.is_valid_token.dtype = DType::i32; }),
            "is_valid_token");
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.step.cum_seq_lens_q = {}; }), "seq_lens");
  EXPECT_EQ(refused([](SparseIndexArgs& a) {
              a.swa.swa_kv_cache.device = {DeviceKind::cuda, 0};
            }),
            "swa_kv_cache");
  std::vector<int32_t> indices(3 * 8), lens(3), seq(3);
  const TensorView overlapping = make_view(lens.data(), DType::i32, Device{}, {3}, {0});
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  a.out = {i32(indices, {3, 4}), overlapping, {}};
  EXPECT_EQ(error_argument([&] { build_sparse_indices(a); }), "sparse_topk_lens");
  a.step.decode_swa_width = 8;  // DSpark: out.seq_lens written too
  a.out = {i32(indices, {3, 8}), i32(lens, {3}),
           make_view(seq.data(), DType::i32, Device{}, {3}, {0})};
  EXPECT_EQ(error_argument([&] { build_sparse_indices(a); }), "out.seq_lens");
}

// Outputs of fewer than T rows are refused by name (the builder would write past them), as are
// an absent table and a token count that is not an int32 count.
TEST(IndexErrors, OutputsHoldTRowsAndTheTokenCountIsOne) {
  std::vector<int32_t> indices(3 * 8), lens(3), seq(3);
  const auto refused = [&](auto&& spoil) {
    SwaOnlyCase c;
    SparseIndexArgs a = c.args();
    a.out = {i32(indices, {3, 4}), i32(lens, {3}), {}};
    spoil(a);
    return error_argument([&] { build_sparse_indices(a); });
  };
  EXPECT_EQ(refused([](SparseIndexArgs&) {}), "");
  EXPECT_EQ(refused([&](SparseIndexArgs& a) {
              a.out.sparse_indices = i32(indices, {2, 4});
            }),
            "sparse_indices");
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.out.sparse_indices = {}; }), "sparse_indices");
  EXPECT_EQ(refused([&](SparseIndexArgs& a) { a.out.sparse_topk_lens = i32(lens, {2}); }),
            "sparse_topk_lens");
  EXPECT_EQ(refused([&](SparseIndexArgs& a) {
              a.step.decode_swa_width = 8;  // DSpark: out.seq_lens holds T lengths
              a.out = {i32(indices, {3, 8}), i32(lens, {3}), i32(seq, {2})};
            }),
            "out.seq_lens");
  EXPECT_EQ(refused([](SparseIndexArgs& a) {
              a.step.seq_lens.data = static_cast<std::byte*>(a.step.seq_lens.data) + 2;
            }),
            "seq_lens");  // not aligned to its 4-byte elements
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.step.num_tokens = -1; }), "num_tokens");
  EXPECT_EQ(refused([](SparseIndexArgs& a) { a.step.num_tokens = int64_t(1) << 31; }),
            "num_tokens");
}

// Every input an output may not overlap, each named: the inputs are placed in an output's memory.
TEST(IndexErrors, OutputsApartFromEveryInput) {
  struct Case {
    const char* input;
    const char* output;
  };
  const Case cases[] = {
      {"cum_seq_lens_q", "sparse_topk_lens"},    {"is_valid_token", "sparse_topk_lens"},
      {"topk_indices", "sparse_indices"},        {"compressed.block_table", "sparse_indices"},
      {"compressed_kv_cache", "sparse_indices"}, {"seq_lens", "out.seq_lens"}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.input);
    MixedCase c;
    SparseIndexArgs a = c.args();
    std::vector<int32_t> indices(6 * 8), lens(6, 0x01010101), seq(6);
    std::vector<uint16_t> rows(5 * 3 * kHeadDim);  // the compressed pool's rows
    a.out = {i32(indices, {6, 8}), i32(lens, {6}), {}};
    const std::string input = k.input;
    if (input == "cum_seq_lens_q") {
      std::copy(c.cum.begin(), c.cum.end(), lens.begin());
      a.step.cum_seq_lens_q = i32(lens, {3});
    } else if (input == "is_valid_token") {
      a.step.is_valid_token = make_view(lens.data(), DType::u8, Device{}, {6});
    } else if (input == "topk_indices") {
      std::copy(c.topk.begin(), c.topk.end(), indices.begin());
      a.compressed.topk_indices = i32(indices, {6, 3});
    } else if (input == "compressed.block_table") {
      std::copy(c.compressed_table.begin(), c.compressed_table.end(), indices.begin());
      a.compressed.block_table = i32(indices, {2, 2});
    } else if (input == "compressed_kv_cache") {
      a.compressed.compressed_kv_cache = make_view(rows.data(), DType::bf16, Device{},
                                                   {5, 2, kHeadDim}, {3 * kHeadDim, kHeadDim, 1});
      a.out.sparse_indices = make_view(rows.data() + kHeadDim, DType::i32, Device{}, {6, 8});
    } else {  // DSpark on an SWA-only layer: its out.seq_lens over the step's seq_lens
      SwaOnlyCase s;
      a = s.args();
      a.step.decode_swa_width = 8;
      a.out = {i32(indices, {3, 8}), i32(lens, {3}), i32(s.seq_lens, {2})};
      a.out.seq_lens.shape[0] = 3;  // seq_lens and one more
      test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, k.output,
                              "memory apart from seq_lens", "an overlap with seq_lens");
      continue;
    }
    test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, k.output,
                            "memory apart from " + input, "an overlap with " + input);
  }
}

// Outputs are written at their strides: a column-major table, and DSpark lengths every other
// element with poison between.
TEST(IndexStrides, OutputsWrittenAtTheirStrides) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(3 * 4, 77), lens(3);
  a.out = {make_view(indices.data(), DType::i32, Device{}, {3, 4}, {1, 3}), i32(lens, {3}), {}};
  build_sparse_indices(a);
  const Rows expected{{30, 31, 32, -1}, {13, 14, 15, 42}, {14, 15, 42, 43}};
  for (int t = 0; t < 3; ++t)
    for (int col = 0; col < 4; ++col)
      EXPECT_EQ(indices[t + 3 * col], expected[t][col]) << t << ", " << col;

  DsparkCase dspark;
  SparseIndexArgs d = dspark.args();
  std::vector<int32_t> rows(4 * 64), row_lens(4), out_seq(8, -9);
  d.out = {i32(rows, {4, 64}), i32(row_lens, {4}),
           make_view(out_seq.data(), DType::i32, Device{}, {4}, {2})};
  build_sparse_indices(d);
  EXPECT_EQ(out_seq, (std::vector<int32_t>{10, -9, 10, -9, 10, -9, 2, -9}));
}

// The step's host views are read at their strides: seq_lens and cum_seq_lens_q every other and
// every third element, with values between that would be refused or build other rows.
TEST(IndexStrides, StepViewsReadAtTheirStrides) {
  SwaOnlyCase c;
  const Built contiguous = build(c.args());
  std::vector<int32_t> seq_lens{3, -7, 6, -7}, cum{0, -7, -7, 1, -7, -7, 3, -7, -7};
  SparseIndexArgs a = c.args();
  a.step.seq_lens = make_view(seq_lens.data(), DType::i32, Device{}, {2}, {2});
  a.step.cum_seq_lens_q = make_view(cum.data(), DType::i32, Device{}, {3}, {3});
  const Built strided = build(a);
  EXPECT_EQ(strided.indices, contiguous.indices);
  EXPECT_EQ(strided.lens, contiguous.lens);
}

// The same errors' kinds and messages: a pool on another device is a type error (as for every
// tensor), cum_seq_lens_q has B + 1 entries, and a page past a block table says what it needed.
TEST(IndexErrors, KindsAndMessages) {
  struct Case {
    const char* name;
    void (*spoil)(SwaOnlyCase&, MixedCase&, SparseIndexArgs&);
    bool mixed;
    ErrorKind kind;
    const char *argument, *expected, *got;
  };
  const Case cases[] = {
      {"swa pool device",
       [](SwaOnlyCase&, MixedCase&, SparseIndexArgs& a) {
         a.swa.swa_kv_cache.device = {DeviceKind::cuda, 0};
       },
       false, ErrorKind::type, "swa_kv_cache", "cpu (the device of the call)", "cuda:0"},
      {"compressed pool device",
       [](SwaOnlyCase&, MixedCase&, SparseIndexArgs& a) {
         a.compressed.compressed_kv_cache.device = {DeviceKind::cuda, 1};
       },
       true, ErrorKind::type, "compressed_kv_cache", "cpu (the device of the call)", "cuda:1"},
      {"cum_seq_lens_q of B + 2",
       [](SwaOnlyCase& c, MixedCase&, SparseIndexArgs& a) {
         c.cum.push_back(3);
         a.step.cum_seq_lens_q = i32(c.cum, {4});
       },
       false, ErrorKind::value, "cum_seq_lens_q", "[B+1 = 3]", "[4]"},
      {"swa page",
       [](SwaOnlyCase& c, MixedCase&, SparseIndexArgs&) {
         c.seq_lens[1] = 9;  // position 8 on a third page (a's view reads c's vector)
       },
       false, ErrorKind::value, "block_table", "a page for position 8 of request 1 (>= 3 pages)",
       "[2, 2]"},
      {"compressed page", [](SwaOnlyCase&, MixedCase& m, SparseIndexArgs&) { m.topk[1] = 4; }, true,
       ErrorKind::value, "topk_indices", "below compressed.block_table pages * E = 4",
       "topk_indices[0][1] = 4"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    SwaOnlyCase swa;
    MixedCase mixed;
    SparseIndexArgs a = k.mixed ? mixed.args() : swa.args();
    k.spoil(swa, mixed, a);
    test::expect_smla_error([&] { build(a); }, k.kind, k.argument, k.expected, k.got);
  }
}

// An fp8_ds_mla pool's pages hold block_size * 584 B of records and scales whatever its token
// stride (here 1000 B): an output between its rows (its own rows 8000 B apart) overlaps it in
// page 0's first 2336 B (SWA or compressed pool), and is apart from it past them.
TEST(IndexErrors, OutputsApartFromDsMlaRecordsBetweenTokenStrides) {
  static std::vector<std::byte> pool(8 * 125 * 576);
  const TensorView ds_mla =
      make_view(pool.data(), DType::u8, Device{}, {8, 4, 584}, {125 * 576, 1000, 1});
  for (const bool compressed : {false, true}) {
    MixedCase c;
    SparseIndexArgs a = c.args();
    (compressed ? a.compressed.compressed_kv_cache : a.swa.swa_kv_cache) = ds_mla;
    const char* name = compressed ? "compressed_kv_cache" : "swa_kv_cache";
    std::vector<int32_t> lens(6);
    for (const int64_t at : {600, 2600}) {
      a.out = {
          make_view(pool.data() + at, DType::i32, Device{}, {6, 8}, {2000, 1}), i32(lens, {6}), {}};
      if (at == 2600) {
        EXPECT_NO_THROW(build_sparse_indices(a)) << name;
        continue;
      }
      test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_indices",
                              std::string("memory apart from ") + name,
                              std::string("an overlap with ") + name);
    }
  }
}

#if !SMLA_WITH_CUDA
// A build without CUDA refuses a valid call on a GPU's tensors as unsupported.
TEST(IndexErrors, DeviceCallWithoutCudaIsUnsupported) {
  MixedCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(6 * 8), lens(6);
  a.out = {i32(indices, {6, 8}), i32(lens, {6}), {}};
  for (TensorView* v :
       {&a.step.seq_lens, &a.step.cum_seq_lens_q, &a.swa.block_table, &a.swa.swa_kv_cache,
        &a.compressed.topk_indices, &a.compressed.block_table, &a.compressed.compressed_kv_cache,
        &a.out.sparse_indices, &a.out.sparse_topk_lens})
    v->device = {DeviceKind::cuda, 0};
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::unsupported,
                          "sparse_indices", "a cpu tensor (this build has no CUDA backend)",
                          "cuda:0");
}
#endif

// Outputs on a device of neither kind (a cast DLPack device type) are refused by the output's
// name, not as the first input's mismatch with them.
TEST(IndexErrors, DeviceOfAnotherKindNamesTheOutputs) {
  MixedCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(6 * 8), lens(6);
  a.out = {i32(indices, {6, 8}), i32(lens, {6}), {}};
  const Device rocm{static_cast<DeviceKind>(10), 0};
  a.out.sparse_indices.device = a.out.sparse_topk_lens.device = rocm;
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::type, "sparse_indices",
                          "a cpu or cuda device", "DLPack device type 10 (id 0)");
}

// A device's cum_seq_lens_q is not read on the host: T <= B x max_q_len, which its values
// imply, is checked instead (tables size their allocation from T). The host's values name the
// request. The views only claim a GPU: the call is refused before a backend could read them.
TEST(IndexErrors, DeviceStepsHoldAtMostMaxQLenTokensARequest) {
  MixedCase c;  // 2 requests: q_len 1 and 5
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(6 * 8), lens(6);
  a.out = {i32(indices, {6, 8}), i32(lens, {6}), {}};
  a.step.max_q_len = 2;
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "max_q_len",
                          ">= every q_len (request 1 has q_len 5)", "2");
  for (TensorView* v :
       {&a.step.seq_lens, &a.step.cum_seq_lens_q, &a.swa.block_table, &a.swa.swa_kv_cache,
        &a.compressed.topk_indices, &a.compressed.block_table, &a.compressed.compressed_kv_cache,
        &a.out.sparse_indices, &a.out.sparse_topk_lens})
    v->device = {DeviceKind::cuda, 0};
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "num_tokens",
                          "<= B x max_q_len = 2 x 2 (every request's q_len is at most "
                          "max_q_len)",
                          "6");
  // No request for the tokens: cum_seq_lens_q, as the CPU names it (the bound above is 0).
  a.step.seq_lens = make_view(c.seq_lens.data(), DType::i32, a.step.seq_lens.device, {0});
  a.step.cum_seq_lens_q = make_view(c.cum.data(), DType::i32, a.step.cum_seq_lens_q.device, {1});
  a.step.num_decodes = 0;
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "cum_seq_lens_q",
                          "a request for the 6 tokens", "B = 0");
}

// num_decodes counts requests: 0..B.
TEST(IndexErrors, NumDecodesWithinTheRequests) {
  for (const int num_decodes : {3, -1}) {
    SwaOnlyCase c;
    SparseIndexArgs a = c.args();
    a.step.num_decodes = num_decodes;
    test::expect_smla_error([&] { build(a); }, ErrorKind::value, "num_decodes", "0..B = 2",
                            std::to_string(num_decodes));
  }
}

// B + 1 is cum_seq_lens_q's size: seq_lens of 2^31 - 1 requests or more (a stride-0 view) is
// refused as the decode refuses it. At 2^63 - 1, B + 1 overflowed (undefined behaviour) and
// cum_seq_lens_q was refused against the wrapped size.
TEST(IndexErrors, RequestsPastInt32AreUnsupported) {
  for (const int64_t requests : {int64_t{INT32_MAX}, INT64_MAX}) {
    SwaOnlyCase c;
    SparseIndexArgs a = c.args();
    a.step.seq_lens = make_view(c.seq_lens.data(), DType::i32, Device{}, {requests}, {0});
    test::expect_smla_error([&] { build(a); }, ErrorKind::unsupported, "seq_lens",
                            "[B] with B < 2^31 - 1", "[" + std::to_string(requests) + "]");
  }
}

// A view's bytes from its data must lie in the address space: the overlap checks take its first
// and last byte as addresses. Row 1 of this block table (never read: one request) lies 2^63 - 8
// bytes past row 0; that address overflowed (undefined behaviour) and the table was taken.
TEST(IndexErrors, ViewsPastTheAddressSpaceAreRefused) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  a.step.num_tokens = 1;
  a.step.seq_lens.shape[0] = 1;
  a.step.cum_seq_lens_q.shape[0] = 2;
  a.step.is_valid_token.shape[0] = 1;
  a.step.num_decodes = 1;
  EXPECT_EQ(build(a).lens, (std::vector<int32_t>{4}));
  const int64_t row = (INT64_MAX - 4) / 4;  // a byte extent of 2^63 - 4: in int64
  a.swa.block_table = make_view(c.block_table.data(), DType::i32, Device{}, {2, 2}, {row, 1});
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "block_table",
                          "sizes and strides whose bytes from data lie in the address space",
                          "[2, 2] with strides [" + std::to_string(row) + ", 1]");
}

// max_q_len is what the decode op is told: >= 1 on any device, and (host values) no request
// of more tokens, named as the decode names it; a larger one is taken. It was taken unchecked
// and refused only by the decode that read the table.
TEST(IndexErrors, MaxQLenCoversEveryRequest) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  for (const int max_q_len : {0, -5}) {
    a.step.max_q_len = max_q_len;
    test::expect_smla_error([&] { build(a); }, ErrorKind::value, "max_q_len", ">= 1",
                            std::to_string(max_q_len));
  }
  a.step.max_q_len = 1;  // request 1 has 2 tokens
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "max_q_len",
                          ">= every q_len (request 1 has q_len 2)", "1");
  const Built want = build(c.args());
  for (const int max_q_len : {2, 7}) {
    a.step.max_q_len = max_q_len;
    const Built b = build(a);
    EXPECT_EQ(b.indices, want.indices) << max_q_len;
    EXPECT_EQ(b.lens, want.lens) << max_q_len;
  }
}

// The DSpark window (decode_swa_width > W) is for decode-only steps, in a width of a multiple
// of 4 (8 = W + 4 is one).
TEST(IndexErrors, DsparkIsDecodeOnlyInAWidthOfFours) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  a.step.decode_swa_width = 64;
  for (const int num_decodes : {1, 0}) {
    a.step.num_decodes = num_decodes;
    test::expect_smla_error([&] { build(a); }, ErrorKind::value, "num_decodes",
                            "B = 2 (the DSpark window is decode-only)",
                            std::to_string(num_decodes));
  }
  a.step.num_decodes = 2;
  a.step.decode_swa_width = 10;  // W + 6
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "decode_swa_width",
                          "a multiple of 4", "10");
  for (const int width : {8, 12}) {  // W + 4, W + 8: any multiple of 4
    a.step.decode_swa_width = width;
    EXPECT_EQ(build(a).seq_lens, (std::vector<int32_t>{3, 6, 6})) << width;
  }
}

// A draft block of q_len tokens sees up to W + q_len positions, all in one row of
// decode_swa_width columns: q_len <= 64 - W = 60 here. Request 1's positions are slots (pages of
// 4 in order), so its rows list the positions [70 - q_len - 4, 70).
TEST(IndexErrors, DsparkDraftBlockFitsTheRow) {
  for (const int q_len : {60, 61}) {
    const int T = 1 + q_len;
    std::vector<int32_t> seq_lens{9, 70}, cum{0, 1, T}, block_table(2 * 18);
    for (int p = 0; p < 18; ++p) block_table[p] = 100 + p, block_table[18 + p] = p;
    SparseIndexArgs a;
    a.window = 4;
    a.step = {.num_tokens = T,
              .seq_lens = i32(seq_lens, {2}),
              .cum_seq_lens_q = i32(cum, {3}),
              .num_decodes = 2,
              .max_q_len = q_len,
              .decode_swa_width = 64};
    a.swa = {i32(block_table, {2, 18}), pool_view(118, 4, 4)};
    // A row's worth of slack: a row that did not fit would write into it, not past the buffer.
    std::vector<int32_t> indices((T + 1) * 64), lens(T), out_seq_lens(T);
    a.out = {i32(indices, {T, 64}), i32(lens, {T}), i32(out_seq_lens, {T})};
    if (q_len == 61) {
      test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "cum_seq_lens_q",
                              "q_len <= decode_swa_width - window = 60", "q_len 61 for request 1");
      continue;
    }
    build_sparse_indices(a);
    for (int c = 0; c < 64; ++c) {
      ASSERT_EQ(indices[64 + c], 6 + c) << "column " << c;           // request 1's first token
      ASSERT_EQ(indices[T * 64 - 64 + c], 6 + c) << "column " << c;  // and its last
    }
    EXPECT_EQ(lens[T - 1], 64);
  }
}

// Both block tables need a row for every request: [B - 1, pages] views of full tables (the rows
// a missing check would read are there) are refused, naming each.
TEST(IndexErrors, BlockTablesCoverEveryRequest) {
  SwaOnlyCase swa;
  SparseIndexArgs a = swa.args();
  a.swa.block_table = i32(swa.block_table, {1, 2});
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "block_table", "[>= B = 2, pages]",
                          "[1, 2]");
  MixedCase mixed;
  a = mixed.args();
  a.compressed.block_table = i32(mixed.compressed_table, {1, 2});
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "compressed.block_table",
                          "[>= B = 2, pages]", "[1, 2]");
}

// A negative ratio is no way to say "SWA-only" (0 is).
TEST(IndexErrors, NegativeCompressRatio) {
  MixedCase c;
  SparseIndexArgs a = c.args();
  a.compressed.compress_ratio = -1;
  test::expect_smla_error([&] { build(a); }, ErrorKind::value, "compress_ratio", ">= 0", "-1");
}

// An output view whose elements overlap (row i, column j and row i + 1, column j - 1 alike)
// would have its columns written over one another.
TEST(IndexErrors, SelfOverlappingOutput) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  std::vector<int32_t> indices(3 * 4), lens(3);
  a.out = {make_view(indices.data(), DType::i32, Device{}, {3, 4}, {1, 1}), i32(lens, {3}), {}};
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "sparse_indices",
                          "non-overlapping elements", "[3, 4] with strides [1, 1]");
}

// decode_swa_width == W is causal (DSpark is > W): no out.seq_lens, which is refused if given.
TEST(IndexErrors, WidthOfTheWindowWritesNoSeqLens) {
  SwaOnlyCase c;
  SparseIndexArgs a = c.args();
  a.step.decode_swa_width = 4;
  std::vector<int32_t> indices(3 * 4), lens(3), seq(3);
  a.out = {i32(indices, {3, 4}), i32(lens, {3}), i32(seq, {3})};
  test::expect_smla_error([&] { build_sparse_indices(a); }, ErrorKind::value, "out.seq_lens",
                          "absent (only the DSpark window writes it)", "i32");
}

// SPEC §4 re-derived token by token from a StepCase.
Built expected(const test::StepCase& c, const SparseIndexArgs& a) {
  const int W = a.window;
  const bool dspark = a.step.decode_swa_width > W;
  const int64_t top_k = a.compressed.compress_ratio ? a.compressed.topk_indices.size(1) : 0;
  const int64_t K = dspark ? a.step.decode_swa_width : W + (top_k + 3) / 4 * 4;
  const TensorView &bt = a.swa.block_table, &pool = a.swa.swa_kv_cache;
  auto read = [](const TensorView& v, int64_t i, int64_t j) {
    return v.ptr<int32_t>()[i * v.strides[0] + j * v.strides[1]];
  };
  auto offset = [](int64_t slot, const TensorView& pool) -> int32_t {
    const int64_t block_size = pool.shape[1], span = pool.strides[0] / pool.strides[1];
    return slot < 0 ? slot : slot / block_size * span + slot % block_size;
  };
  Built e;
  for (int t = 0; t < c.num_tokens(); ++t) {
    const int b = c.request(t), pos = c.pos(t);
    const int seq_len = a.step.seq_lens.ptr<int32_t>()[b];
    const int q_len =
        a.step.cum_seq_lens_q.ptr<int32_t>()[b + 1] - a.step.cum_seq_lens_q.ptr<int32_t>()[b];
    std::vector<int32_t> row(K, -1);
    int32_t len = W;
    if (c.valid(t)) {
      int first = std::max(pos - W + 1, 0), last = pos + 1;
      if (dspark) first = std::max(seq_len - q_len - W, 0), last = seq_len;
      for (int p = first; p < last; ++p)
        row[p - first] = offset(
            int64_t{read(bt, b, p / pool.shape[1])} * pool.shape[1] + p % pool.shape[1], pool);
      if (dspark) len = std::max(last - first, W);
      const int ratio = a.compressed.compress_ratio;
      if (ratio > 0) {
        const TensorView& cpool = a.compressed.compressed_kv_cache;
        const int64_t E = cpool.shape[1];
        const bool decode = b < a.step.num_decodes;
        const int64_t used = decode ? top_k : std::min<int64_t>((pos + 1) / ratio, top_k);
        int count = 0;
        for (int64_t j = 0; j < used; ++j) {
          const int32_t x = read(a.compressed.topk_indices, t, j);
          row[W + j] =
              x < 0 ? x
                    : offset(int64_t{read(a.compressed.block_table, b, x / E)} * E + x % E, cpool);
          count += x >= 0;
        }
        len = W + (decode ? count : used);
      }
    }
    e.indices.push_back(row);
    e.lens.push_back(len);
    if (dspark) e.seq_lens.push_back(seq_len);
  }
  return e;
}

void expect_matches(const test::StepCase& c, int layer) {
  const SparseIndexArgs a = c.args(layer);
  const Built got = build(a), want = expected(c, a);
  ASSERT_EQ(got.indices.size(), want.indices.size());
  for (size_t t = 0; t < got.indices.size(); ++t)
    ASSERT_EQ(got.indices[t], want.indices[t]) << "layer " << layer << " token " << t;
  EXPECT_EQ(got.lens, want.lens) << "layer " << layer;
  EXPECT_EQ(got.seq_lens, want.seq_lens) << "layer " << layer;
}

// Fresh steps each run, a third of them with a window of 1 to 300, half with negative top-k
// entries (where prefill and decode rows count them differently); a failure names the seed
// (SMLA_TEST_SEED replays it).
TEST(IndexRandom, MatchesThePlainRules) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int trial = 0; trial < 30; ++trial) {
    test::CaseShape s = test::random_shape(rng, trial);
    if (trial % 3 == 1) s.window = std::uniform_int_distribution<int>(1, 300)(rng);
    const int ratio = std::uniform_int_distribution<int>(1, 4)(rng);
    test::StepCase c(test::three_layers(ratio, s.window), s, rng());
    if (trial % 2) c.punch_topk_holes();
    for (int layer = 0; layer < 3; ++layer) expect_matches(c, layer);
  }
}

TEST(IndexRandom, DsparkMatchesThePlainRules) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int trial = 0; trial < 10; ++trial) {
    const test::CaseShape s = test::random_dspark_shape(rng, trial);
    const test::StepCase c({{.layer = 0, .num_heads = 1}}, s, rng());
    expect_matches(c, 0);
  }
}

// decode_swa_width in 1..W is the causal window: the rows of width 0, and no out.seq_lens
// (build passes none; one is required only past W).
TEST(IndexRandom, WidthUpToTheWindowIsCausal) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int trial = 0; trial < 10; ++trial) {
    const test::CaseShape s = test::random_shape(rng, trial);
    const int ratio = std::uniform_int_distribution<int>(1, 4)(rng);
    const test::StepCase c(test::three_layers(ratio), s, rng());
    for (int layer = 0; layer < 3; ++layer) {
      SparseIndexArgs a = c.args(layer);
      const Built causal = build(a);
      for (const int width : {a.window, std::uniform_int_distribution<int>(1, a.window)(rng)}) {
        a.step.decode_swa_width = width;
        const Built got = build(a);
        EXPECT_EQ(got.indices, causal.indices) << "layer " << layer << " width " << width;
        EXPECT_EQ(got.lens, causal.lens) << "layer " << layer << " width " << width;
        EXPECT_TRUE(got.seq_lens.empty());
      }
    }
  }
}

TEST(IndexRandom, ThreadCountDoesNotChangeTheRows) {
  test::CaseShape s{.q_lens = {3, 700, 450}, .seq_lens = {900, 1500, 450}, .num_decodes = 1};
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const test::StepCase c(test::three_layers(4), s, seed);
  const SparseIndexArgs a = c.args(2);
  test::ThreadsEnv threads("1");
  const Built one = build(a);
  threads.set("4");
  const Built four = build(a);
  EXPECT_EQ(one.indices, four.indices);
  EXPECT_EQ(one.lens, four.lens);
}

}  // namespace
}  // namespace smla
