// The CPU backend against the float64 oracle over random cases (fresh inputs for every check;
// a failure prints the seed, replayable with SMLA_TEST_SEED).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "address_space_cap.h"
#include "caller_fp_modes.h"
#include "core/problem.h"
#include "core/sanitizers.h"
#include "cpu/backend.h"
#include "nan_row.h"
#include "oracle.h"
#include "smla/decode.h"
#include "smla/quantize.h"
#include "threads_env.h"

namespace smla::test {
namespace {

// Rows that nothing attends are poisoned with NaN/Inf in every check, the outputs with NaN.
void check(const CaseSpec& spec, uint64_t seed = fresh_seed()) {
  DecodeCase c = make_case(spec, seed);
  poison_unattended_rows(c);
  ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
  EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
}

// Fewer tokens for many heads keeps the whole suite within a minute on two cores.
CaseSpec sized(CaseSpec spec) {
  if (spec.heads >= 64) spec.requests = 2, spec.max_q = spec.heads >= 128 ? 2 : 3;
  return spec;
}

// A spec drawn from the whole space; one seed picks it and the case, so that
// SMLA_TEST_SEED replays both.
CaseSpec random_spec(uint64_t seed) {
  Rng rng(seed ^ 0x5eed5eed5eed5eedull);
  CaseSpec s;
  s.layout = static_cast<KvLayout>(rng.uniform(0, 2));
  if (s.layout == KvLayout::fp8_e4m3 && rng.chance(0.5)) s.query_dtype = DType::f8e4m3;
  // 6, 7 and 30: the backend's last block of 4 heads partial, with 2, 3 and 2 heads.
  const int heads[] = {1, 6, 7, 8, 16, 24, 30, 32, 64, 128};
  s.heads = heads[rng.uniform(0, std::size(heads) - 1)];
  if (rng.chance(0.3)) s.out_heads = s.heads + static_cast<int>(rng.uniform(1, 16));
  s.requests = static_cast<int>(rng.uniform(1, 5));
  s.varlen = rng.chance(0.8);
  if (rng.chance(0.2)) s.window = 4 * static_cast<int>(rng.uniform(1, 48));
  s.compressed_width = 4 * static_cast<int>(rng.uniform(0, 64));
  s.sinks = static_cast<SinkKind>(rng.uniform(0, 4));
  s.lse = rng.chance(0.8);
  s.extremes = s.layout != KvLayout::bf16 && rng.chance(0.3);
  s.masked = rng.real(0, 0.5);
  return sized(s);
}

// One token, one head, W = 4, K = 8, a long sequence: a case small enough to work out by hand.
// Its query is all 1/64, so a score is bmm1_scale * (sum of the row) / 64.
DecodeCase tiny_case(KvLayout layout, std::vector<int32_t> columns) {
  DecodeCase c = make_case({.layout = layout,
                            .heads = 1,
                            .q_lens = {1},
                            .window = 4,
                            .compressed_width = 4,
                            .sinks = SinkKind::finite,
                            .pools = PoolSharing::absent},
                           fresh_seed());
  c.seq_lens.set<int32_t>(0, 100);
  for (int d = 0; d < kHeadDim; ++d) c.query.set<uint16_t>(d, to_bf16(1.0 / 64));
  for (int col = 0; col < 8; ++col) c.sparse_indices.set<int32_t>(col, columns[col]);
  c.sparse_topk_lens.set<int32_t>(0, 8);
  return c;
}

double out_at(const DecodeCase& c, int d) { return ref_bf16(c.out.get<uint16_t>(d)); }

// Rows A = 0.5 and B = -0.25; A attended twice, B once, sink 1:
// out = bmm2 (2A + e^-3 B) / (2 + e^-3 + e^-1), lse = 2 + log(2 + e^-3).
TEST(Decode, HandComputedBf16WithSinkAndDuplicate) {
  DecodeCase c = tiny_case(KvLayout::bf16, {0, 0, 1, -1, -1, -1, -1, -1});
  const RefPool pool(c.swa_kv_cache);
  for (int d = 0; d < kHeadDim; ++d) {
    c.swa_kv_cache.store(pool.record(0) + 2 * d, to_bf16(0.5));
    c.swa_kv_cache.store(pool.record(1) + 2 * d, to_bf16(-0.25));
  }
  c.sinks.set<float>(0, 1.f);
  c.bmm1_scale = 0.5f, c.bmm2_scale = 1.5f;
  sparse_mla_decode(c.args());
  const double out = 1.5 * (2 * 0.5 - 0.25 * std::exp(-3)) / (2 + std::exp(-3) + std::exp(-1));
  const double lse = 2 + std::log(2 + std::exp(-3));
  for (int d = 0; d < kHeadDim; ++d) ASSERT_NEAR(out_at(c, d), out, std::abs(out) / 256);
  EXPECT_NEAR(c.lse.get<float>(0), lse, 1e-6);
  const Reference r = oracle(c);
  EXPECT_NEAR(r.out[0], out, 1e-12);
  EXPECT_NEAR(r.lse[0], lse, 1e-12);
}

// A score whose float sum overflows (2^100 x -2^100 = -2^200) is -inf: where every attended
// score is, nothing is attended (output 0, lse -inf, with a finite, -inf, +inf or no sink; SPEC
// §2's formula with a finite sink, and CUDA's), never NaN; beside a NaN score the NaN stays.
TEST(Decode, OverflowedScoresAttendNothing) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const float sink : {1.f, -kInf, kInf, NAN})  // NaN: no sinks
    for (const bool beside_nan : {false, true}) {
      SCOPED_TRACE("sink " + std::to_string(sink) + (beside_nan ? ", a NaN score" : ""));
      DecodeCase c = tiny_case(KvLayout::bf16, {-1, 3, beside_nan ? 2 : -1, -1, -1, -1, -1, -1});
      const RefPool pool(c.swa_kv_cache);
      for (int d = 0; d < kHeadDim; ++d) {
        c.swa_kv_cache.store(pool.record(3) + 2 * d, to_bf16(d == 0 ? -0x1p100 : 0.0));
        c.swa_kv_cache.store(pool.record(2) + 2 * d, uint16_t(d == 5 ? 0x7fc0 : 0));
      }
      c.query.set<uint16_t>(0, to_bf16(0x1p100));
      if (std::isnan(sink))
        c.sinks = HostTensor{};
      else
        c.sinks.set<float>(0, sink);
      sparse_mla_decode(c.args());
      for (int d = 0; d < kHeadDim; ++d) {
        if (beside_nan && sink != kInf)
          ASSERT_TRUE(std::isnan(out_at(c, d))) << "dim " << d;
        else
          ASSERT_EQ(out_at(c, d), 0.0) << "dim " << d;
      }
      if (beside_nan)
        EXPECT_TRUE(std::isnan(c.lse.get<float>(0)));
      else
        EXPECT_EQ(c.lse.get<float>(0), -kInf);
    }
}

// One fp8_ds_mla row: NoPE group g holds e4m3 1.0 (0x38) under scale 2^(g-3), except for 448
// (0x7E) at d = 1 and the smallest subnormal 2^-9 (0x01) at d = 2; RoPE is bf16 1.0. With
// one attended row and no sink, out = bmm2 * row and lse = the score.
TEST(Decode, HandComputedDsMlaRecordAndScales) {
  DecodeCase c = tiny_case(KvLayout::fp8_ds_mla, {-1, 3, -1, -1, -1, -1, -1, -1});
  c.sinks = HostTensor{};
  const RefPool pool(c.swa_kv_cache);
  std::array<double, kHeadDim> row;
  for (int d = 0; d < kNopeDim; ++d) {
    const uint8_t code = d == 1 ? 0x7e : d == 2 ? 0x01 : 0x38;
    c.swa_kv_cache.store<uint8_t>(pool.record(3) + d, code);
    row[d] = (d == 1 ? 448.0 : d == 2 ? std::ldexp(1.0, -9) : 1.0) * std::ldexp(1.0, d / 64 - 3);
  }
  for (int g = 0; g < 7; ++g) c.swa_kv_cache.store<uint8_t>(pool.scale_record(3) + g, 124 + g);
  for (int d = kNopeDim; d < kHeadDim; ++d) {
    c.swa_kv_cache.store(pool.record(3) + kNopeDim + 2 * (d - kNopeDim), to_bf16(1.0));
    row[d] = 1.0;
  }
  c.bmm1_scale = 0.25f, c.bmm2_scale = 2.f;
  sparse_mla_decode(c.args());
  double sum = 0;
  for (int d = 0; d < kHeadDim; ++d) {
    sum += row[d];
    ASSERT_NEAR(out_at(c, d), 2 * row[d], 2 * row[d] / 256) << "d = " << d;
  }
  EXPECT_NEAR(c.lse.get<float>(0), 0.25 * sum / 64, 1e-6);
}

// SPEC §2: UE8M0 byte 255 means 2^128, past every float but finite: a group of zero codes under
// it contributes 0 (not 0 * inf = NaN). The rest as above at scale 1, so out = bmm2 * row.
TEST(Decode, DsMlaScaleByte255IsTwoTo128) {
  DecodeCase c = tiny_case(KvLayout::fp8_ds_mla, {-1, 3, -1, -1, -1, -1, -1, -1});
  c.sinks = HostTensor{};
  const RefPool pool(c.swa_kv_cache);
  for (int d = 0; d < kNopeDim; ++d)
    c.swa_kv_cache.store<uint8_t>(pool.record(3) + d, d < 64 ? 0x00 : 0x38);
  for (int g = 0; g < 7; ++g)
    c.swa_kv_cache.store<uint8_t>(pool.scale_record(3) + g, g ? 127 : 255);
  for (int d = kNopeDim; d < kHeadDim; ++d)
    c.swa_kv_cache.store(pool.record(3) + kNopeDim + 2 * (d - kNopeDim), to_bf16(1.0));
  c.bmm1_scale = 0.25f, c.bmm2_scale = 1.f;
  sparse_mla_decode(c.args());
  for (int d = 0; d < kHeadDim; ++d) ASSERT_EQ(out_at(c, d), d < 64 ? 0.0 : 1.0) << "d = " << d;
  EXPECT_NEAR(c.lse.get<float>(0), 0.25 * (kHeadDim - 64) / 64, 1e-6);
  EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
}

TEST(Decode, RandomSpecs) {
  for (int i = 0; i < 24; ++i) {
    const uint64_t seed = fresh_seed();
    check(random_spec(seed), seed);
  }
}

TEST(Decode, Bf16EveryHeadCount) {
  for (int heads : {1, 6, 7, 8, 16, 24, 30, 32, 64, 128})
    for (int i = 0; i < 2; ++i) check(sized({.heads = heads}));
}

TEST(Decode, Fp8PerTensorBf16Query) {
  for (int heads : {1, 16, 64, 128}) check(sized({.layout = KvLayout::fp8_e4m3, .heads = heads}));
}

TEST(Decode, Fp8PerTensorFp8Query) {
  for (int heads : {8, 24, 64, 128})
    check(sized({.layout = KvLayout::fp8_e4m3, .query_dtype = DType::f8e4m3, .heads = heads}));
}

TEST(Decode, Fp8DsMla) {
  for (int heads : {1, 8, 32, 64, 128})
    check(sized({.layout = KvLayout::fp8_ds_mla, .heads = heads}));
}

// Every finite e4m3 code (±448, subnormals) and, for fp8_ds_mla, every UE8M0 exponent of
// 127 ± 20 plus 0, 1, 2, 230 and 240.
TEST(Decode, Fp8Extremes) {
  for (int i = 0; i < 3; ++i) {
    check({.layout = KvLayout::fp8_ds_mla, .heads = 16, .extremes = true});
    check({.layout = KvLayout::fp8_e4m3, .heads = 16, .extremes = true});
    check(
        {.layout = KvLayout::fp8_e4m3, .query_dtype = DType::f8e4m3, .heads = 8, .extremes = true});
  }
}

// Scores spread wide: a row's max rises by many log2 units from block to block. No sinks: with
// a sink far above every score, an output underflows float32 where the float64 oracle's does not.
TEST(Decode, WideScores) {
  for (const auto& [layout, query] : {std::pair{KvLayout::bf16, DType::bf16},
                                      std::pair{KvLayout::fp8_ds_mla, DType::bf16},
                                      std::pair{KvLayout::fp8_e4m3, DType::f8e4m3}})
    check(sized({.layout = layout, .query_dtype = query, .heads = 16, .compressed_width = 512,
                 .sinks = SinkKind::absent, .score_spread = 40}));
}

// Two attended rows whose scores lie 1000 nats apart, past exp's range (709): the output is
// the high row times bmm2 and the LSE its score, whichever of the two columns comes first.
TEST(Decode, ScoresFurtherApartThanExpsRange) {
  for (const int high : {0, 1}) {
    std::vector<uint16_t> pool(2 * kHeadDim, 0), query(kHeadDim, to_bf16(1.0));
    std::vector<uint16_t> out(kHeadDim, 0xffff);  // NaN until written
    for (int d = 0; d < kHeadDim; ++d)  // 512 x 1.953125 = 1000 exactly; the other row scores 0
      pool[high * kHeadDim + d] = to_bf16(1.953125);
    std::vector<int32_t> indices{0, 1, -1, -1}, lens{2}, seq_lens{5};
    std::vector<float> lse{std::numeric_limits<float>::quiet_NaN()};
    const Device cpu{};
    DecodeArgs a;
    a.query = make_view(query.data(), DType::bf16, cpu, {1, 1, kHeadDim});
    a.swa_kv_cache = make_view(pool.data(), DType::bf16, cpu, {1, 2, kHeadDim});
    a.sparse_indices = make_view(indices.data(), DType::i32, cpu, {1, 4});
    a.sparse_topk_lens = make_view(lens.data(), DType::i32, cpu, {1});
    a.seq_lens = make_view(seq_lens.data(), DType::i32, cpu, {1});
    a.out = make_view(out.data(), DType::bf16, cpu, {1, 1, kHeadDim});
    a.lse = make_view(lse.data(), DType::f32, cpu, {1, 1});
    a.window = 4;
    a.bmm1_scale = 1;
    a.bmm2_scale = 0.5f;
    sparse_mla_decode(a);
    for (int d = 0; d < kHeadDim; ++d)
      ASSERT_EQ(out[d], to_bf16(0.9765625)) << "high row " << high << ", d " << d;
    EXPECT_NEAR(lse[0], 1000.0, 1e-3) << "high row " << high;
  }
}

// CaseSpec::integer_fp8 (the GPU's wide-score cases with an e4m3 query): every query code is
// -1, 0 or 1 and every cache code an integer in [-7, 7], each value drawn; the case decodes.
TEST(Decode, IntegerFp8Cases) {
  const CaseSpec spec{.layout = KvLayout::fp8_e4m3, .query_dtype = DType::f8e4m3, .heads = 16,
                      .sinks = SinkKind::absent, .pools = PoolSharing::absent,
                      .score_spread = 40, .integer_fp8 = true};
  DecodeCase c = make_case(spec, fresh_seed());
  std::set<double> query, cache;
  for (int64_t t = 0; t < c.query.size(0); ++t)
    for (int64_t i = 0; i < c.query.size(1) * 512; ++i)
      query.insert(ref_e4m3(c.query.load<uint8_t>(t * c.query.stride(0) + i)));
  const RefPool pool(c.swa_kv_cache);
  for (int64_t o = 0; o < pool.blocks * pool.span; ++o)
    if (pool.valid(o))
      for (double v : pool.row(o)) cache.insert(v);
  EXPECT_EQ(query, (std::set<double>{-1, 0, 1})) << c.summary;
  std::set<double> integers;
  for (int n = -7; n <= 7; ++n) integers.insert(n);
  EXPECT_EQ(cache, integers) << c.summary;
  check(spec, c.seed);
}

TEST(Decode, EverySinkKind) {
  for (SinkKind sinks :
       {SinkKind::absent, SinkKind::neg_inf, SinkKind::finite, SinkKind::pos_inf, SinkKind::mixed})
    for (KvLayout layout : {KvLayout::bf16, KvLayout::fp8_ds_mla})
      check({.layout = layout, .heads = 8, .sinks = sinks});
}

// The backend reads cum_seq_lens_q again after validate_decode checked it. Boundaries changed in
// between (by another thread: a race the caller owns) give wrong rows but stay inside the
// tokens: here request 0 then claims every token, and every output (poisoned) is written.
TEST(Decode, QueryBoundariesChangedAfterValidationStayInsideTheTokens) {
  for (const int32_t boundary : {1 << 20, -7}) {
    DecodeCase c = make_case({.heads = 4, .q_lens = {2, 3}}, fresh_seed());
    SCOPED_TRACE(c.summary);
    const DecodeArgs a = c.args();
    const DecodeProblem problem = validate_decode(a);
    c.cum_seq_lens_q.set<int32_t>(1, boundary);
    cpu::decode(problem, a);
    for (int64_t i = 0; i < c.out.size(0) * c.out.size(1) * kHeadDim; ++i)
      ASSERT_TRUE(std::isfinite(ref_bf16(c.out.get<uint16_t>(i)))) << "element " << i;
  }
}

// sparse_topk_lens too is read again after validate_decode checked it. A length changed in
// between (a race the caller owns) past K reads no column beyond its own row: here token 0 then
// claims 2K columns, the last K of them token 1's row, and gives what K gives.
TEST(Decode, TopkLengthsChangedAfterValidationReadOnlyTheirRow) {
  // Token 1's row must hold a row of the compressed pool, or reading it would change nothing.
  DecodeCase c = make_case_where(
      {.heads = 4, .q_lens = {2, 3}, .masked = 0}, fresh_seed(), [](const DecodeCase& c) {
        const int64_t K = c.sparse_indices.size(1);
        const RefPool compressed(c.compressed_kv_cache.defined() ? c.compressed_kv_cache
                                                                 : c.swa_kv_cache);
        for (int64_t col = 0; col < K; ++col)
          if (compressed.valid(c.sparse_indices.get<int32_t>(K + col))) return true;
        return false;
      });
  SCOPED_TRACE(c.summary);
  const int64_t K = c.sparse_indices.size(1);
  c.sparse_topk_lens.set<int32_t>(0, static_cast<int32_t>(K));
  poison_unattended_rows(c);
  const Reference reference = oracle(c);
  const DecodeArgs a = c.args();
  const DecodeProblem problem = validate_decode(a);
  c.sparse_topk_lens.set<int32_t>(0, static_cast<int32_t>(2 * K));
  cpu::decode(problem, a);
  EXPECT_TRUE(matches(c, reference, Tolerance::reference()));
}

TEST(Decode, VarlenMixedQueryLengths) {
  check({.heads = 16, .q_lens = {1, 6, 2, 5, 3, 4}});
  check({.heads = 8, .q_lens = {17, 1, 2}});  // a prefill-like request among decodes
  check({.heads = 32, .requests = 5, .max_q = 6});
}

TEST(Decode, OneTokenPerRequestWithoutCumSeqLens) {
  check({.heads = 16, .requests = 6, .varlen = false});
  check({.layout = KvLayout::fp8_ds_mla, .heads = 64, .requests = 3, .varlen = false});
}

TEST(Decode, PaddedOutputHeadsAreZero) {
  check({.heads = 8, .out_heads = 64});
  check({.heads = 24, .out_heads = 32});
  check({.layout = KvLayout::fp8_e4m3, .heads = 1, .out_heads = 8});
}

TEST(Decode, WithoutLse) { check({.heads = 16, .lse = false}); }

TEST(Decode, EveryPoolSharing) {
  for (PoolSharing pools : {PoolSharing::absent, PoolSharing::same, PoolSharing::separate})
    for (KvLayout layout : kKvLayouts)
      check({.layout = layout, .heads = 8, .pools = pools});
}

TEST(Decode, OtherWindowsAndWidths) {
  check({.heads = 8, .window = 64, .compressed_width = 0});   // SWA-only: K == W
  check({.heads = 8, .window = 4, .compressed_width = 124});  // columns past W dominate
  check({.heads = 16, .compressed_width = 1024});             // V4-Pro top-k
}

// A row of 2^24 columns, padding but for its last three: the CPU took storage for every column
// before gathering the rows they attend, 2^24 x 2 KiB a thread (32 GiB), and threw
// std::bad_alloc. Under an address-space limit of 4 GiB past what the process has mapped it
// gives, bit for bit, what the row of those three columns alone gives.
TEST(Decode, LongRowOfPaddingTakesStorageForItsAttendedRowsAlone) {
#if defined(SMLA_ASAN)
  GTEST_SKIP() << "AddressSanitizer maps more than an address-space limit leaves";
#endif
  DecodeCase c =
      make_case({.heads = 5, .q_lens = {1}, .compressed_width = 4, .pools = PoolSharing::absent},
                fresh_seed());
  const int64_t K = c.sparse_indices.size(1);
  for (int64_t col = 0; col < K; ++col)
    c.sparse_indices.set<int32_t>(col, col < K - 3 ? -1 : int32_t(col - (K - 3)));
  c.sparse_topk_lens.set<int32_t>(0, int32_t(K));
  DecodeArgs a = c.args();
  sparse_mla_decode(a);
  const std::vector<std::byte> out = c.out.bytes, lse = c.lse.bytes;
  poison_outputs(c);
  std::vector<int32_t> row(int64_t(1) << 24, -1);
  std::copy_n(c.sparse_indices.bytes.data() + (K - 3) * 4, 12,
              reinterpret_cast<std::byte*>(row.data() + row.size() - 3));
  int32_t len = int32_t(row.size());
  a.sparse_indices = make_view(row.data(), DType::i32, Device{}, {1, int64_t(row.size())});
  a.sparse_topk_lens = make_view(&len, DType::i32, Device{}, {1});

  const AddressSpaceCap cap(rlim_t{4} << 30);
  ASSERT_TRUE(cap.ok());
  const ThreadsEnv threads("2");  // both threads gather the token (5 heads: 2 blocks)
  ASSERT_NO_THROW(sparse_mla_decode(a));
  EXPECT_EQ(c.out.bytes, out);
  EXPECT_EQ(c.lse.bytes, lse);
}

// Empty S(t) by length, by the causal window and by offsets: zero output, lse -inf, no NaN,
// whatever the query holds.
TEST(Decode, AllMaskedRowsGiveZero) {
  for (KvLayout layout : kKvLayouts)
    for (bool nonfinite : {false, true})
      check({.layout = layout,
             .heads = 8,
             .sinks = SinkKind::mixed,
             .all_masked = true,
             .nonfinite_query = nonfinite});
}

// SPEC §2's zeros as CUDA writes them: the heads H..H_out-1 and every head of a token whose S(t)
// is empty are +0 in every bit (matches() takes a -0 for 0), the empty heads' lse -inf. All
// tokens empty (by each of rules 1-3), or a random third of them by length 0 among others.
TEST(Decode, ZeroOutputsArePositiveZeroBits) {
  for (KvLayout layout : kKvLayouts)
    for (bool all_masked : {true, false}) {
      const uint64_t seed = fresh_seed();
      Rng rng(seed + 1);
      const int heads = static_cast<int>(rng.uniform(1, 9));
      DecodeCase c = make_case({.layout = layout,
                                .heads = heads,
                                .out_heads = heads + static_cast<int>(rng.uniform(1, 8)),
                                .requests = 4,
                                .all_masked = all_masked},
                               seed);
      for (int64_t t = 0; t < c.sparse_topk_lens.size(0); ++t)
        if (t == 0 || rng.chance(0.3)) c.sparse_topk_lens.set<int32_t>(t, 0);
      poison_unattended_rows(c);
      ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
      EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
      const auto rows = attended_rows(c);
      int64_t empty = 0;
      for (int64_t t = 0; t < c.out.size(0); ++t) {
        empty += rows[t].empty();
        for (int h = 0; h < c.out.size(1); ++h) {
          if (h < heads && !rows[t].empty()) continue;
          for (int d = 0; d < kHeadDim; ++d)
            ASSERT_EQ(c.out.get<uint16_t>(t * c.out.stride(0) + h * c.out.stride(1) + d), 0)
                << "token " << t << ", head " << h << ", d " << d << ": " << c.summary;
          if (h < heads)
            EXPECT_EQ(c.lse.get<float>(t * c.lse.stride(0) + h * c.lse.stride(1)),
                      -std::numeric_limits<float>::infinity())
                << "token " << t << ", head " << h << ": " << c.summary;
        }
      }
      EXPECT_GT(empty, 0) << c.summary;
    }
}

// SPEC §2: a +inf sink gives its head output 0 whatever the head attends, a row holding a NaN
// too (the formula's bmm2 * acc / inf would be 0 * NaN); the other heads of a token attending
// that row carry the NaN. One NaN value in one attended row of every token, +inf sinks on a
// random half of the heads (at least one). A case where no token attends a row (about one seed in
// 10^4) would leave nothing to zero: make_attending_case draws another.
TEST(Decode, PosInfSinkZeroesAHeadAttendingANanRow) {
  for (KvLayout layout : kKvLayouts) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(test::seed_note(seed));
    DecodeCase c = make_attending_case(
        {.layout = layout, .heads = 8, .sinks = SinkKind::mixed, .masked = 0.1}, seed);
    Rng rng(c.seed + 1);
    const int H = static_cast<int>(c.query.size(1));
    std::vector<bool> pos_inf(H);
    const int always = static_cast<int>(rng.uniform(0, H - 1));
    for (int h = 0; h < H; ++h) {
      if (h == always || rng.chance(0.5))
        c.sinks.set<float>(h, std::numeric_limits<float>::infinity());
      pos_inf[h] = c.sinks.get<float>(h) == std::numeric_limits<float>::infinity();
    }
    const auto rows = attended_rows(c);
    std::vector<bool> attends_nan(rows.size());
    for (size_t t = 0; t < rows.size(); ++t) {
      if (rows[t].empty()) continue;
      const AttendedRow& r =
          rows[t][static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(rows[t].size()) - 1))];
      HostTensor& pool =
          r.compressed && c.compressed_kv_cache.defined() ? c.compressed_kv_cache : c.swa_kv_cache;
      const RefPool ref(pool);
      const int d = static_cast<int>(rng.uniform(0, kNopeDim - 1));
      if (layout == KvLayout::bf16)
        pool.store<uint16_t>(ref.record(r.offset) + 2 * d, 0x7fc0);
      else
        pool.store<uint8_t>(ref.record(r.offset) + d, 0x7f);  // e4m3 NaN
    }
    for (size_t t = 0; t < rows.size(); ++t)  // a row may serve several tokens
      for (const AttendedRow& r : rows[t]) {
        const HostTensor& pool = r.compressed && c.compressed_kv_cache.defined()
                                     ? c.compressed_kv_cache
                                     : c.swa_kv_cache;
        for (double v : RefPool(pool).row(r.offset))
          attends_nan[t] = attends_nan[t] || std::isnan(v);
      }
    ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
    int64_t zeroed = 0;
    for (int64_t t = 0; t < c.out.size(0); ++t)
      for (int h = 0; h < H; ++h) {
        bool zero = true, finite = true;
        for (int d = 0; d < kHeadDim; ++d) {
          const double x =
              ref_bf16(c.out.get<uint16_t>(t * c.out.stride(0) + h * c.out.stride(1) + d));
          zero = zero && x == 0;
          finite = finite && std::isfinite(x);
        }
        if (pos_inf[h]) {
          ASSERT_TRUE(zero) << "token " << t << ", head " << h << " (+inf sink"
                            << (attends_nan[t] ? ", attending a NaN row" : "")
                            << "): " << c.summary;
          zeroed += attends_nan[t];
        } else if (attends_nan[t]) {
          ASSERT_FALSE(finite) << "token " << t << ", head " << h << ": " << c.summary;
        }
      }
    EXPECT_GT(zeroed, 0) << c.summary;
  }
}

// NaN/Inf in rows no attended column points to (poisoned by check(); here most columns point
// at padding, past the pool or packed slots) never reaches the output.
TEST(Decode, UnattendedNanRowsDoNotLeak) {
  for (KvLayout layout : kKvLayouts) {
    DecodeCase c = make_case({.layout = layout, .heads = 8, .masked = 0.6}, fresh_seed());
    poison_unattended_rows(c);
    sparse_mla_decode(c.args());
    for (int64_t i = 0; i < c.out.size(0) * c.out.size(1) * kHeadDim; ++i)
      ASSERT_FALSE(std::isnan(ref_bf16(c.out.get<uint16_t>(i))) ||
                   std::isinf(ref_bf16(c.out.get<uint16_t>(i))))
          << c.summary;
    EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
  }
}

#ifdef SMLA_TEST_CALLER_FP_MODES
// Every value of the bf16 pools' valid rows as `row()` gives it, every query value as `query()`
// does (bf16 bits).
template <class Row, class Query>
void set_bf16_values(DecodeCase& c, Row&& row, Query&& query) {
  for (HostTensor* t : {&c.swa_kv_cache, &c.compressed_kv_cache}) {
    if (!t->defined()) continue;
    const RefPool pool(*t);
    for (int64_t o = 0; o < pool.blocks * pool.span; ++o)
      if (pool.valid(o))
        for (int d = 0; d < kHeadDim; ++d) t->store<uint16_t>(pool.record(o) + 2 * d, row());
  }
  for (int64_t tok = 0; tok < c.query.size(0); ++tok)
    for (int h = 0; h < c.query.size(1); ++h)
      for (int d = 0; d < kHeadDim; ++d)
        c.query.set<uint16_t>(tok * c.query.stride(0) + h * c.query.stride(1) + d, query());
}

// The case decoded under each caller mode writes the bytes it writes under IEEE's default mode,
// which match the oracle.
void expect_no_byte_changes_under_caller_modes(DecodeCase& c) {
  ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
  const std::vector<std::byte> ieee = c.out.bytes, ieee_lse = c.lse.bytes;
  EXPECT_TRUE(matches(c, oracle(c), Tolerance::reference()));
  for (const CallerFpMode& mode : kCallerFpModes) {
    std::fill(c.out.bytes.begin(), c.out.bytes.end(), std::byte{0xff});
    std::fill(c.lse.bytes.begin(), c.lse.bytes.end(), std::byte{0xff});
    EXPECT_TRUE(under_caller_mode(mode, [&] { sparse_mla_decode(c.args()); })) << mode.name;
    EXPECT_TRUE(c.out.bytes == ieee) << mode.name << ", " << c.summary;
    EXPECT_TRUE(c.lse.bytes == ieee_lse) << mode.name << ", " << c.summary;
  }
}

// A caller's float modes (torch.set_flush_denormal(True)'s flush-to-zero and denormals-are-zero,
// fesetround's directions) change no output byte: rows of bf16 subnormals, read as zeros under
// the flush modes, against a query near 2^100, on the caller's thread and the workers alike.
TEST(Decode, FloatModesOfTheCallerChangeNoByte) {
  const uint64_t seed = fresh_seed();
  DecodeCase c = make_case({.heads = 8, .sinks = SinkKind::absent, .masked = 0.05}, seed);
  Rng rng(seed + 1);
  set_bf16_values(
      c, [&] { return static_cast<uint16_t>(rng.uniform(1, 127) | (rng.chance(0.5) << 15)); },
      [&] { return to_bf16(std::ldexp(rng.normal(), 100)); });
  c.bmm1_scale = 1;
  c.bmm2_scale = std::ldexp(1.0f, 100);  // outputs of normal size (~2^-30)
  expect_no_byte_changes_under_caller_modes(c);
}

// The float arithmetic that a flush-to-zero mode alone (FTZ, MXCSR bit 15, without DAZ) would
// change: scores whose products are float subnormals (a 2^-10 query against rows near 2^-120,
// bmm1 2^125 bringing the scores to O(1)), and outputs that round to float subnormals (bmm2
// 2^-10: outputs near 2^-130, kept by bf16's subnormals). Under the caller's flush modes the
// same bytes as without them, which match the oracle; under the rounding directions too.
TEST(Decode, FlushModesKeepSubnormalProductsAndOutputs) {
  struct Scales {
    const char* what;
    int query_exponent;
    float bmm1, bmm2;
  };
  for (const Scales& s : {Scales{"subnormal products", -10, 0x1p125f, 0x1p120f},
                          Scales{"subnormal outputs", 0, 0x1p115f, 0x1p-10f}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(s.what) + ", " + seed_note(seed));
    DecodeCase c = make_case({.heads = 8, .sinks = SinkKind::absent, .masked = 0.05}, seed);
    Rng rng(seed + 1);
    set_bf16_values(
        c, [&] { return to_bf16(std::ldexp(rng.normal(), -120)); },
        [&] { return to_bf16(std::ldexp(rng.normal(), s.query_exponent)); });
    c.bmm1_scale = s.bmm1;
    c.bmm2_scale = s.bmm2;
    expect_no_byte_changes_under_caller_modes(c);
  }
}
#endif

// A NaN quantized into an fp8_ds_mla row reaches the outputs of the tokens attending it only;
// the padding heads stay zeros.
TEST(Decode, ANanQuantizedIntoADsMlaRowReachesItsTokens) {
  NanRowCase n(fresh_seed(), 12, 16, 4);
  DecodeArgs a = n.c.args();
  const auto data = [](HostTensor& t) { return static_cast<void*>(t.bytes.data()); };
  quantize_kv(n.row.view(data(n.row), Device{}), n.slots.view(data(n.slots), Device{}),
              a.swa_kv_cache);
  sparse_mla_decode(a);
  EXPECT_TRUE(nan_reaches_its_tokens_only(n));
}

// The byte offset of every element of `t`, in row-major order of its indices.
std::vector<int64_t> element_offsets(const HostTensor& t) {
  std::vector<int64_t> offsets{0};
  for (size_t d = 0; d < t.shape.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t base : offsets)
      for (int64_t i = 0; i < t.size(static_cast<int>(d)); ++i)
        next.push_back(base + i * t.stride(static_cast<int>(d)) *
                                  static_cast<int64_t>(dtype_size(t.dtype)));
    offsets = std::move(next);
  }
  return offsets;
}

// `t`'s elements laid out with `strides`, every other byte 0xff (a NaN in any float type).
HostTensor restrided(const HostTensor& t, std::vector<int64_t> strides) {
  HostTensor r = HostTensor::make(t.dtype, t.shape, std::move(strides));
  std::fill(r.bytes.begin(), r.bytes.end(), std::byte{0xff});
  const auto from = element_offsets(t), to = element_offsets(r);
  for (size_t i = 0; i < from.size(); ++i)
    std::memcpy(r.bytes.data() + to[i], t.bytes.data() + from[i], dtype_size(t.dtype));
  return r;
}

// Query and out whose heads lie further apart than a row, lse's tokens further apart than H (the
// gaps NaN): the same bits as the contiguous call, and no byte of a gap written.
TEST(Decode, PaddedHeadStrides) {
  for (KvLayout layout : {KvLayout::bf16, KvLayout::fp8_e4m3}) {
    CaseSpec spec{.layout = layout, .heads = 8, .requests = 3};
    if (layout == KvLayout::fp8_e4m3) spec.query_dtype = DType::f8e4m3;
    DecodeCase c = make_case(spec, fresh_seed());
    poison_unattended_rows(c);
    const int64_t H = c.query.size(1), H_out = c.out.size(1);
    DecodeCase padded = c;
    padded.query = restrided(c.query, {H * 576, 576, 1});
    // The outputs all 0xff bytes (NaNs unlike c's poison: an element neither call writes
    // differs); out's tokens a stride of their own, lse's heads contiguous, SPEC's only lse
    // layout.
    padded.out = HostTensor::make(c.out.dtype, c.out.shape, {H_out * 640 + 64, 640, 1});
    padded.lse = HostTensor::make(c.lse.dtype, c.lse.shape, {H + 3, 1});
    for (HostTensor* t : {&padded.out, &padded.lse})
      std::fill(t->bytes.begin(), t->bytes.end(), std::byte{0xff});
    ASSERT_NO_THROW(sparse_mla_decode(c.args())) << c.summary;
    ASSERT_NO_THROW(sparse_mla_decode(padded.args())) << c.summary;
    const std::pair<const HostTensor*, const HostTensor*> outputs[] = {{&c.out, &padded.out},
                                                                        {&c.lse, &padded.lse}};
    for (const auto& [dense, strided] : outputs) {
      const auto from = element_offsets(*dense), to = element_offsets(*strided);
      std::vector<bool> element(strided->bytes.size());
      const size_t size = dtype_size(dense->dtype);
      for (size_t i = 0; i < from.size(); ++i) {
        ASSERT_EQ(std::memcmp(dense->bytes.data() + from[i], strided->bytes.data() + to[i], size),
                  0)
            << "element " << i << ", " << c.summary;
        std::fill_n(element.begin() + to[i], size, true);
      }
      for (size_t b = 0; b < element.size(); ++b)
        ASSERT_TRUE(element[b] || strided->bytes[b] == std::byte{0xff})
            << "a gap's byte " << b << " written, " << c.summary;
    }
  }
}

// Work is split in (token, block of 4 heads) units over threads, a token's rows gathered by
// each thread that has some of its blocks; the split must not change a single bit. One token's
// heads too spread over threads, the last block partial when H is no multiple of 4.
TEST(Decode, ThreadCountDoesNotChangeBits) {
  const CaseSpec specs[] = {
      {.heads = 40, .requests = 4}, {.heads = 16, .q_lens = {1}}, {.heads = 6, .q_lens = {1}}};
  for (const CaseSpec& spec : specs) {
    DecodeCase c = make_case(spec, fresh_seed());
    test::ThreadsEnv threads("1");
    sparse_mla_decode(c.args());
    const auto out = c.out.bytes, lse = c.lse.bytes;
    for (const char* count : {"3", "5"}) {  // poisoned unlike make_case's outputs
      std::fill(c.out.bytes.begin(), c.out.bytes.end(), std::byte{0xff});
      std::fill(c.lse.bytes.begin(), c.lse.bytes.end(), std::byte{0xff});
      threads.set(count);
      sparse_mla_decode(c.args());
      EXPECT_EQ(out, c.out.bytes) << count << " threads, " << c.summary;
      EXPECT_EQ(lse, c.lse.bytes) << count << " threads, " << c.summary;
    }
  }
}

}  // namespace
}  // namespace smla::test
