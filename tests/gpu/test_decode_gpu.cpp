// The CUDA kernel against the float64 oracle and the CPU backend on fresh random cases, plus
// the persistent-counter, determinism and graph-capture contracts of SPEC §3.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/backend.h"
#include "cuda/decode_plan.h"
#include "cuda/device.h"
#include "device_case.h"
#include "device_step.h"
#include "error_check.h"
#include "nan_row.h"
#include "oracle.h"
#include "smla/decode.h"
#include "smla/error.h"
#include "smla/quantize.h"

namespace smla::test {
namespace {

// A CPU-backend result as a Reference, to hold the GPU to it with the device tolerance.
Reference reference_of(const DecodeCase& c, const Reference& exact) {
  Reference r;
  r.lse_terms = exact.lse_terms;  // the inputs' score magnitudes
  r.tokens = c.out.size(0), r.out_heads = static_cast<int>(c.out.size(1));
  r.heads = static_cast<int>(c.query.size(1));
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int h = 0; h < r.out_heads; ++h)
      for (int d = 0; d < 512; ++d)
        r.out.push_back(
            ref_bf16(c.out.get<uint16_t>(t * c.out.stride(0) + h * c.out.stride(1) + d)));
  if (c.lse.defined())
    for (int64_t t = 0; t < r.tokens; ++t)
      for (int h = 0; h < r.heads; ++h)
        r.lse.push_back(c.lse.get<float>(t * c.lse.stride(0) + h * c.lse.stride(1)));
  return r;
}

// The GPU's result for `c` (poisoned outputs and unattended rows), checked against the
// oracle and the CPU backend; split buffers as DeviceCase takes them. Returns the launch's
// plan (checked against a capture of the launch), so that callers can count the cases that
// split.
cuda::DecodePlan check_against_oracle_and_cpu(const CaseSpec& spec, size_t counter_bytes = SIZE_MAX,
                                              size_t ws_bytes = SIZE_MAX) {
  DecodeCase gpu = make_case(spec, fresh_seed());
  poison_unattended_rows(gpu);
  DecodeCase cpu = gpu;
  cuda::DecodePlan plan;
  std::unique_ptr<DeviceCase> device;
  try {  // a launch that throws (an illegal address) still names the case and its seed
    sparse_mla_decode(cpu.args());
    device = std::make_unique<DeviceCase>(gpu, counter_bytes, ws_bytes);
    plan = device->plan();
    // The launch is the plan the tests count: its grid, its clusters, one kernel and nothing else.
    const CapturedLaunch launch = captured_launch(device->args);
    EXPECT_EQ(launch.nodes, 1u) << gpu.summary;
    EXPECT_EQ(launch.ctas, plan.ctas) << gpu.summary;
    EXPECT_EQ(launch.cluster, plan.cluster ? plan.num_splits : 1) << gpu.summary;
    sparse_mla_decode(device->args);
    CUDA_THROW(cudaDeviceSynchronize());  // not ASSERT_CUDA: this function returns a value
  } catch (...) {
    ADD_FAILURE() << gpu.summary;
    throw;
  }
  const DeviceCase& d = *device;
  d.fetch(gpu);
  // Integer e4m3 rows and query: e4m3 wgmma get the scores exactly, so bf16's bounds hold.
  const Tolerance tol = Tolerance::device(spec.integer_fp8 ? DType::bf16 : spec.query_dtype);
  const Reference exact = oracle(gpu);
  EXPECT_TRUE(matches(gpu, exact, tol)) << "vs oracle";
  EXPECT_TRUE(matches(gpu, reference_of(cpu, exact), tol)) << "vs CPU backend";
  EXPECT_TRUE(all_zero(d.counter_values())) << "counters not returned to zero; " << gpu.summary;
  EXPECT_TRUE(d.guards_intact()) << "bytes past the workspace or counters written; " << gpu.summary;
  // The launch reduced as the plan the tests count says: partials stored for counter plans only.
  EXPECT_EQ(d.workspace_written(), plan.num_splits > 1 && !plan.cluster)
      << plan.num_splits << " splits, cluster " << plan.cluster << "; " << gpu.summary;
  return plan;
}

// How a case's split rows may be reduced: as the planner likes (in clusters where they pay), only
// through the counters (clusters off), or not at all (clusters off and no counters or workspace
// given: one CTA a row). The launch's plan is checked to obey it.
enum class Reduction { any, counters, unsplit };

cuda::DecodePlan check_reduced(const CaseSpec& spec, Reduction reduction) {
  std::optional<CountersOnly> counters_only;
  if (reduction != Reduction::any) counters_only.emplace();
  const size_t bytes = reduction == Reduction::unsplit ? 0 : SIZE_MAX;
  const cuda::DecodePlan plan = check_against_oracle_and_cpu(spec, bytes, bytes);
  if (reduction == Reduction::counters) EXPECT_FALSE(plan.cluster) << "clusters off";
  if (reduction == Reduction::unsplit) EXPECT_EQ(plan.num_splits, 1) << "no split buffers";
  return plan;
}

// Every other case reduces its split rows through the counters instead of clusters.
TEST(GpuDecode, RandomCasesAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  const int heads[] = {1, 8, 16, 32, 64, 100, 128};
  const int widths[] = {4, 64, 128, 512, 1024};
  int cases = 0, split = 0, counter_reduced = 0;
  for (int round = 0; round < 6; ++round)
    for (int h : heads)
      for (int width : widths) {
        CaseSpec spec{.heads = h, .compressed_width = width};
        spec.requests = h >= 64 ? 2 : 3 + round % 3;
        spec.max_q = round % 2 ? 6 : 2;
        spec.out_heads = round % 3 == 0 ? (h <= 64 ? 64 : 128) : 0;
        spec.all_masked = round == 5 && width == 64;
        spec.varlen = round != 4;  // else no cum_seq_lens_q: a token a request
        const Reduction reduction = cases % 2 ? Reduction::counters : Reduction::any;
        const cuda::DecodePlan plan = check_reduced(spec, reduction);
        split += plan.num_splits > 1;
        counter_reduced += reduction == Reduction::counters && plan.num_splits > 1;
        ++cases;
        if (HasFailure()) return;
      }
  EXPECT_GT(split, 0) << "cases whose rows split, of " << cases;
  EXPECT_GT(counter_reduced, 0) << "split cases reduced through the counters, of " << cases;
}

// A token's request (its position, so its window) found by the warp's search: one round of loads
// for up to 32 requests, after one round of probes up to 1024 and two past that; ragged tokens
// per request, against the oracle and the CPU.
TEST(GpuDecode, TokensFindTheirRequestPastAWarp) {
  SKIP_WITHOUT_GPU();
  for (int requests : {1, 31, 32, 33, 70, 1024, 1025, 1500})
    for (int max_q : {1, 4}) {
      check_against_oracle_and_cpu({.heads = 8, .requests = requests, .max_q = max_q});
      if (HasFailure()) return;
    }
}

// Device offsets are not checked: tokens past cum_seq_lens_q[B] read nothing past seq_lens or
// cum_seq_lens_q (values placed right after them change no output or lse bit), whether the
// token's request is found by one round of the warp's loads (B <= 32) or after probes; the other
// requests' tokens still match the oracle.
TEST(GpuDecode, TokensPastTheLastRequestReadNothingPastTheViews) {
  SKIP_WITHOUT_GPU();
  for (int requests : {5, 32, 40, 1500}) {
    // 0 to 2 tokens a request, but 1 or 2 in the last, whose tokens are cut past cum[B] (from
    // an empty one, cum_seq_lens_q would decrease).
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    std::vector<int> q_lens(requests);
    for (int& q : q_lens) q = static_cast<int>(rng.uniform(0, 2));
    q_lens.back() = static_cast<int>(rng.uniform(1, 2));
    DecodeCase c = make_case({.heads = 8, .q_lens = q_lens}, seed);
    SCOPED_TRACE(c.summary);
    DeviceCase d(c);
    const int B = requests;
    std::vector<int32_t> seq(B + 1), cum(B + 2);
    CUDA_THROW(cudaMemcpy(seq.data(), d.args.seq_lens.data, 4 * B, cudaMemcpyDeviceToHost));
    CUDA_THROW(cudaMemcpy(cum.data(), d.args.cum_seq_lens_q.data, 4 * (B + 1),
                          cudaMemcpyDeviceToHost));
    ASSERT_GT(cum[B], cum[B - 1]);
    cum[B] -= c.query.shape[0] > cum[B - 1] + 1 ? 2 : 1;  // the last one or two tokens: past it
    const DeviceMemory seq_mem(4 * (B + 1)), cum_mem(4 * (B + 2));
    DecodeArgs args = d.args;
    args.seq_lens = make_view(seq_mem.get(), DType::i32, d.device, {B});
    args.cum_seq_lens_q = make_view(cum_mem.get(), DType::i32, d.device, {B + 1});
    std::vector<std::byte> first, first_lse;
    for (int32_t past : {0, 1 << 20}) {
      seq[B] = past, cum[B + 1] = past;
      CUDA_THROW(cudaMemcpy(seq_mem.get(), seq.data(), 4 * (B + 1), cudaMemcpyHostToDevice));
      CUDA_THROW(cudaMemcpy(cum_mem.get(), cum.data(), 4 * (B + 2), cudaMemcpyHostToDevice));
      d.poison_outputs(c);
      sparse_mla_decode(args);
      ASSERT_CUDA(cudaDeviceSynchronize());
      d.fetch(c);
      if (first.empty()) {
        first = c.out.bytes, first_lse = c.lse.bytes;
        Reference in_requests = oracle(c);  // requests 0..B-2 are as generated
        in_requests.tokens = cum[B - 1];
        EXPECT_TRUE(matches(c, in_requests, Tolerance::device(DType::bf16)));
      } else {
        EXPECT_TRUE(first == c.out.bytes) << B << " requests: the output read past a view";
        EXPECT_TRUE(first_lse == c.lse.bytes) << B << " requests: the lse read past a view";
      }
    }
  }
}

// A dim of size 1 is read at index 0 alone, so its stride may be anything (PyTorch up to 2.9
// exports such strides as 1): one token, and one head, with the bits of row-major strides.
TEST(GpuDecode, SizeOneDimsTakeAnyStride) {
  SKIP_WITHOUT_GPU();
  for (int heads : {1, 64}) {
    DecodeCase c = make_case(
        {.heads = heads, .requests = 1, .max_q = 1, .varlen = false, .compressed_width = 512},
        fresh_seed());
    SCOPED_TRACE(c.summary);
    DeviceCase d(c);
    sparse_mla_decode(d.args);
    ASSERT_CUDA(cudaDeviceSynchronize());
    d.fetch(c);
    EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(DType::bf16)));
    const std::vector<std::byte> row_major = c.out.bytes, row_major_lse = c.lse.bytes;
    DecodeArgs args = d.args;
    for (TensorView* v : {&args.query, &args.out})
      for (int dim : {0, 1})
        if (v->size(dim) == 1) v->strides[dim] = 1;
    d.poison_outputs(c);
    sparse_mla_decode(args);
    ASSERT_CUDA(cudaDeviceSynchronize());
    d.fetch(c);
    EXPECT_TRUE(row_major == c.out.bytes) << "H=" << heads;
    EXPECT_TRUE(row_major_lse == c.lse.bytes) << "H=" << heads << ": lse";
  }
}

// Outputs in views with gaps: out's heads 1040 bytes apart, lse's tokens H + 5 floats apart (its
// last dim must be contiguous). Each value equals the contiguous launch's bit for bit, and the
// gaps keep their poison: unsplit, cluster and counter plans, with padded heads.
TEST(GpuDecode, OutAndLseViewsWithGaps) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kPitch = kHeadDim + 8, kLsePad = 5;
  for (int heads : {16, 64, 100})
    for (Reduction reduction : {Reduction::any, Reduction::counters, Reduction::unsplit}) {
      std::optional<CountersOnly> counters_only;
      if (reduction != Reduction::any) counters_only.emplace();
      DecodeCase c =
          make_case({.heads = heads, .out_heads = 128, .compressed_width = 512}, fresh_seed());
      SCOPED_TRACE(c.summary);
      const size_t split_bytes = reduction == Reduction::unsplit ? 0 : SIZE_MAX;
      DeviceCase d(c, split_bytes, split_bytes);
      sparse_mla_decode(d.args);
      ASSERT_CUDA(cudaDeviceSynchronize());
      d.fetch(c);
      EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(DType::bf16)));

      const int64_t T = c.out.size(0), H_out = c.out.size(1), lse_pitch = heads + kLsePad;
      DeviceMirror gpu;  // poisoned: 0xffff a bf16 gap, 0xffffffff an f32 one
      const TensorView out_rows = gpu.output(DType::bf16, {T, H_out, kPitch}, 0xff);
      const TensorView lse_rows = gpu.output(DType::f32, {T, lse_pitch}, 0xff);
      DecodeArgs args = d.args;
      args.out = out_rows, args.out.shape[2] = kHeadDim;
      args.lse = lse_rows, args.lse.shape[1] = heads;
      sparse_mla_decode(args);
      const std::vector<std::byte> out_bytes = bytes_of(out_rows), lse_bytes = bytes_of(lse_rows);
      const auto* out = reinterpret_cast<const uint16_t*>(out_bytes.data());
      const auto* lse = reinterpret_cast<const uint32_t*>(lse_bytes.data());
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H_out; ++h)
          for (int64_t e = 0; e < kPitch; ++e) {
            const uint16_t want =
                e < kHeadDim ? c.out.get<uint16_t>(t * c.out.stride(0) + h * c.out.stride(1) + e)
                             : 0xffff;
            bad += out[(t * H_out + h) * kPitch + e] != want;
          }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < lse_pitch; ++h) {
          const uint32_t want = h < heads
                                    ? c.lse.get<uint32_t>(t * c.lse.stride(0) + h * c.lse.stride(1))
                                    : 0xffffffffu;
          bad += lse[t * lse_pitch + h] != want;
        }
      EXPECT_EQ(bad, 0) << "elements unlike the contiguous launch's, or gaps written";
      if (HasFailure()) return;
    }
}

// Split rows reduced in clusters of every size the planner picks (2..16 CTAs), with 16 to 64
// heads a CTA and a partial head block, against the oracle and the CPU backend.
TEST(GpuDecode, ClusterSplitsOfEverySize) {
  SKIP_WITHOUT_GPU();
  const cuda::Occupancy gpu = cuda::decode_occupancy(0);
  std::set<std::pair<int, int>> plans;  // (cluster size, heads a CTA)
  std::set<int> sizes;
  for (int tokens : {1, 3, 5, 8, 13, 64})
    for (int heads : {16, 40, 128})
      for (int width = 64; width <= 1024; width += 64) {
        const cuda::DecodePlan plan = cuda::plan_decode(tokens, heads, kWindow + width,
                                                        KvLayout::bf16, gpu, SIZE_MAX, SIZE_MAX);
        if (!plan.cluster || !plans.insert({plan.num_splits, plan.heads_per_cta}).second) continue;
        sizes.insert(plan.num_splits);
        CaseSpec spec{.heads = heads, .q_lens = {tokens}, .compressed_width = width};
        spec.out_heads = heads + 8;
        check_against_oracle_and_cpu(spec);
        if (HasFailure()) return;
      }
  EXPECT_GE(sizes.size(), 6u) << "cluster sizes covered: " << sizes.size();
  // The non-portable sizes too, which H100 and H200 run (SMLA_REQUIRE_GPU: the GPU machine).
  if (gpu.cluster_ctas[cuda::kMaxClusterSplits] > 0 || gpu_required())
    EXPECT_GT(*sizes.rbegin(), cuda::kPortableClusterCtas) << "largest cluster covered";
  EXPECT_GE(plans.size(), 12u) << "(cluster size, heads a CTA) pairs covered: " << plans.size();
}

// One split row over a cluster past the portable size, small enough for the sanitizers.
TEST(GpuDecode, WideClusterSplits) {
  SKIP_WITHOUT_GPU();
  if (cuda::decode_occupancy(0).cluster_ctas[cuda::kMaxClusterSplits] == 0) {
    // H100 and H200 run them: on the GPU machine (SMLA_REQUIRE_GPU=1) none is a regression.
    if (gpu_required()) FAIL() << "SMLA_REQUIRE_GPU=1 and no clusters past 8 CTAs";
    GTEST_SKIP() << "this device runs no clusters past " << cuda::kPortableClusterCtas << " CTAs";
  }
  const CaseSpec spec{.heads = 16, .q_lens = {1, 1}, .compressed_width = 1024};
  const cuda::DecodePlan plan = check_against_oracle_and_cpu(spec);
  EXPECT_TRUE(plan.cluster && plan.num_splits > cuda::kPortableClusterCtas) << plan.num_splits;
}

// Plans without splits (no clusters, no split buffers: SPEC §3's fallback), where bf16 caches
// read the query by TMA: every head count, padded output heads, rows attending nothing, against
// the oracle and the CPU. fp8 caches too: a CTA's 20 tiles cycle the e4m3 kernel's four raw
// buffers five times (their scores read them in place).
TEST(GpuDecode, UnsplitPlansAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  for (int h : {1, 8, 16, 32, 64, 100, 128})
    for (int width : {64, 512}) {
      CaseSpec spec{.heads = h, .requests = 3, .max_q = 3, .compressed_width = width};
      spec.out_heads = width == 64 ? (h + 15) / 16 * 16 + 8 : 0;
      check_reduced(spec, Reduction::unsplit);
      if (HasFailure()) return;
    }
  for (int h : {64, 128}) {  // rows of no column (rule 1, 2 or 3): nothing attended
    CaseSpec spec{.heads = h, .requests = 3, .max_q = 3, .compressed_width = 64};
    spec.all_masked = true;
    check_reduced(spec, Reduction::unsplit);
    if (HasFailure()) return;
  }
  const std::pair<KvLayout, DType> fp8[] = {{KvLayout::fp8_e4m3, DType::f8e4m3},
                                            {KvLayout::fp8_ds_mla, DType::bf16}};
  for (const auto& [layout, query] : fp8)
    for (int h : {16, 64, 128}) {
      check_reduced({.layout = layout,
                     .query_dtype = query,
                     .heads = h,
                     .requests = 3,
                     .max_q = 3,
                     .compressed_width = 512},
                    Reduction::unsplit);
      if (HasFailure()) return;
    }
}

// Queries of at least kQueryEvictFirstBytes, whose TMA loads carry the L2 evict-first policy
// (bf16, and an e4m3 query with an e4m3 cache, one head block), against the oracle and the CPU.
// Their 160 CTAs run in two waves on an H100 or H200: the bf16 first wave's fetch of the
// second's query and first rows into L2 (prefetch_next_wave) reads tables with padding, offsets
// past the pool and packed slots.
TEST(GpuDecode, LargeQueriesAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3}};
  for (const auto& [layout, query] : kinds) {
    const int64_t token_bytes = 64 * 512 * int64_t(dtype_size(query));
    const int tokens = int((cuda::kQueryEvictFirstBytes + token_bytes - 1) / token_bytes);
    CaseSpec spec{.layout = layout, .query_dtype = query, .heads = 64,
                  .q_lens = std::vector<int>((tokens + 1) / 2, 2), .compressed_width = 64};
    const cuda::DecodePlan plan = check_against_oracle_and_cpu(spec, 0, 0);
    EXPECT_EQ(plan.num_splits, 1);  // with 64 heads a CTA: the query by TMA
    EXPECT_EQ(plan.heads_per_cta, cuda::kMmaRows);
    if (HasFailure()) return;
  }
}

// How check_query_view stores the query: heads last to first (a negative head stride), one row
// for every head (a zero stride), or heads 520 elements apart, the gaps NaN (1040 bytes for
// bf16, which a TMA map holds; 520 for e4m3, which it does not: 16-byte multiples only).
enum class QueryView { reversed, broadcast, padded };

// One query view of a fresh case, stored as elements of type E (the query's dtype), against the
// oracle and the CPU backend.
template <class E>
void check_query_view(KvLayout layout, DType dtype, int h, QueryView view) {
  DecodeCase gpu = make_case({.layout = layout, .query_dtype = dtype, .heads = h, .requests = 3,
                              .max_q = 3, .compressed_width = 512},
                             fresh_seed());
  const int64_t T = gpu.query.size(0);
  HostTensor& q = gpu.query;  // [T, H, 512], heads contiguous
  const int64_t ts = q.stride(0);
  if (view == QueryView::broadcast)  // the view below reads head 0's row for every head
    for (int64_t t = 0; t < T; ++t)
      for (int head = 1; head < h; ++head)
        for (int d = 0; d < 512; ++d) q.set<E>(t * ts + head * 512 + d, q.get<E>(t * ts + d));
  poison_unattended_rows(gpu);
  DecodeCase cpu = gpu;
  sparse_mla_decode(cpu.args());
  DeviceCase d(gpu, 0, 0);
  // The same logical query, stored as the view says; all-ones bits (NaN) where no head is.
  const int stored_heads = view == QueryView::broadcast ? 1 : h;
  const int64_t pitch = view == QueryView::padded ? 520 : 512;
  std::vector<E> rows(T * stored_heads * pitch, static_cast<E>(~0u));
  for (int64_t t = 0; t < T; ++t)
    for (int head = 0; head < stored_heads; ++head) {
      const int slot = view == QueryView::reversed ? stored_heads - 1 - head : head;
      for (int d = 0; d < 512; ++d)
        rows[(t * stored_heads + slot) * pitch + d] = q.get<E>(t * ts + head * 512 + d);
    }
  DeviceMemory stored(rows.size() * sizeof(E));
  ASSERT_CUDA(cudaMemcpy(stored.get(), rows.data(), rows.size() * sizeof(E),
                         cudaMemcpyHostToDevice));
  E* base = static_cast<E*>(stored.get());
  const Device dev = d.device;
  d.args.query =
      view == QueryView::reversed
          ? make_view(base + (h - 1) * 512, dtype, dev, {T, h, 512}, {h * 512, -512, 1})
      : view == QueryView::broadcast
          ? make_view(base, dtype, dev, {T, h, 512}, {512, 0, 1})
          : make_view(base, dtype, dev, {T, h, 512}, {h * pitch, pitch, 1});
  sparse_mla_decode(d.args);
  ASSERT_CUDA(cudaDeviceSynchronize());
  d.fetch(gpu);
  const Tolerance tol = Tolerance::device(dtype);
  const std::string what = std::string(kv_layout_name(layout)) + ", H=" + std::to_string(h) +
                           ", view " + std::to_string(static_cast<int>(view));
  const Reference exact = oracle(gpu);
  EXPECT_TRUE(matches(gpu, exact, tol)) << "vs oracle, " << what;
  EXPECT_TRUE(matches(gpu, reference_of(cpu, exact), tol)) << "vs CPU, " << what;
}

// Query views a TMA map cannot describe (heads in reverse order: a negative head stride; an
// e4m3 query's heads 520 bytes apart) or describes with a zero stride (every head one row) or
// a padded one (bf16 heads 1040 bytes apart), on unsplit plans of 64 heads a CTA, where bf16,
// fp8_ds_mla and e4m3-query caches read the query by TMA if the driver encodes
// its map and by cp.async otherwise.
TEST(GpuDecode, ReversedBroadcastAndPaddedQueryViews) {
  SKIP_WITHOUT_GPU();
  const CountersOnly counters_only;
  for (int h : {64, 128})
    for (QueryView view : {QueryView::reversed, QueryView::broadcast, QueryView::padded}) {
      check_query_view<uint16_t>(KvLayout::bf16, DType::bf16, h, view);
      check_query_view<uint16_t>(KvLayout::fp8_ds_mla, DType::bf16, h, view);
      check_query_view<uint8_t>(KvLayout::fp8_e4m3, DType::f8e4m3, h, view);
      if (HasFailure()) return;
    }
}

// A NaN quantized into an fp8_ds_mla row on the GPU (its group's codes 0x7F under scale byte
// 255, which the kernel's bf16 conversion reads as inf) reaches the outputs of the tokens
// attending it only, as on the CPU (tests/cpu/test_decode.cpp), and the padding heads stay
// zeros (a zero query row's scores are 0 x inf there) in unsplit, cluster and counter plans.
TEST(GpuDecode, ANanQuantizedIntoADsMlaRowReachesItsTokens) {
  SKIP_WITHOUT_GPU();
  std::set<std::string> reductions;
  for (int round = 0; round < 6; ++round) {
    const bool wide = round % 2;  // two head blocks, the last one part padding
    std::optional<CountersOnly> counters;
    if (round / 2 == 1) counters.emplace();
    NanRowCase n(fresh_seed(), wide ? 100 : 12, wide ? 128 : 16, round / 2 == 2 ? 128 : 4);
    DeviceCase d(n.c);
    const cuda::DecodePlan plan = d.plan();
    reductions.insert(plan.num_splits == 1 ? "unsplit" : plan.cluster ? "cluster" : "counters");
    const DeviceMemory row(n.row.bytes.size()), slots(n.slots.bytes.size());
    CUDA_THROW(cudaMemcpy(row.get(), n.row.bytes.data(), row.bytes(), cudaMemcpyHostToDevice));
    CUDA_THROW(
        cudaMemcpy(slots.get(), n.slots.bytes.data(), slots.bytes(), cudaMemcpyHostToDevice));
    quantize_kv(n.row.view(row.get(), d.device), n.slots.view(slots.get(), d.device),
                d.args.swa_kv_cache);
    sparse_mla_decode(d.args);
    ASSERT_CUDA(cudaDeviceSynchronize());
    d.fetch(n.c);
    EXPECT_TRUE(nan_reaches_its_tokens_only(n)) << plan.num_splits << " splits";
  }
  EXPECT_EQ(reductions.size(), 3u) << "plans of every reduction";
}

// Scores whose float sums overflow to -inf (every head's query 2^100 against -2^100 in every
// row's dim 0) attend nothing, as on the CPU (tests/cpu/test_decode.cpp): output 0 and lse -inf
// under every sink kind, in unsplit, cluster and counter plans, never NaN.
TEST(GpuDecode, OverflowedScoresAttendNothing) {
  SKIP_WITHOUT_GPU();
  std::set<std::string> reductions;
  for (const Reduction reduction : {Reduction::unsplit, Reduction::any, Reduction::counters}) {
    std::optional<CountersOnly> counters_only;
    if (reduction != Reduction::any) counters_only.emplace();
    const size_t bytes = reduction == Reduction::unsplit ? 0 : SIZE_MAX;
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    DecodeCase c = make_case({.heads = 16,
                              .requests = 2,
                              .max_q = 2,
                              .compressed_width = 1024,
                              .pools = PoolSharing::absent},
                             seed);
    const RefPool pool(c.swa_kv_cache);
    for (int64_t row = 0; row < pool.blocks * pool.span; ++row)
      if (pool.valid(row)) c.swa_kv_cache.store(pool.record(row), to_bf16(-0x1p100));
    for (int64_t t = 0; t < c.query.size(0); ++t)
      for (int64_t h = 0; h < c.query.size(1); ++h)
        c.query.set<uint16_t>(t * c.query.stride(0) + h * c.query.stride(1), to_bf16(0x1p100));
    DecodeCase cpu = c;
    sparse_mla_decode(cpu.args());
    DeviceCase d(c, bytes, bytes);
    const cuda::DecodePlan plan = d.plan();
    reductions.insert(plan.num_splits == 1 ? "unsplit" : plan.cluster ? "cluster" : "counters");
    sparse_mla_decode(d.args);
    ASSERT_CUDA(cudaDeviceSynchronize());
    d.fetch(c);
    for (const DecodeCase* r : {&cpu, &c}) {
      const char* who = r == &cpu ? "CPU" : "GPU";
      for (size_t i = 0; i < r->out.bytes.size() / 2; ++i)
        ASSERT_EQ(ref_bf16(r->out.get<uint16_t>(i)), 0.0)
            << who << " out[" << i << "]; " << c.summary;
      for (size_t i = 0; i < r->lse.bytes.size() / 4; ++i)
        ASSERT_EQ(r->lse.get<float>(i), -INFINITY) << who << " lse[" << i << "]; " << c.summary;
    }
  }
  EXPECT_EQ(reductions.size(), 3u) << "plans of every reduction";
}

// A row split over many CTAs reuses one counter buffer 1000 times without a reset between
// launches: every launch equals the first bitwise and the buffer ends zeroed.
TEST(GpuDecode, ThousandLaunchesOnOneCounterBuffer) {
  SKIP_WITHOUT_GPU();
  const CountersOnly counters_only;
  DecodeCase c = make_case({.heads = 64, .requests = 1, .max_q = 2, .compressed_width = 1024,
                            .sinks = SinkKind::finite, .masked = 0.02},
                           fresh_seed());
  poison_unattended_rows(c);
  SCOPED_TRACE(c.summary);
  DeviceCase d(c);
  const cuda::DecodePlan plan = d.plan();
  ASSERT_TRUE(plan.num_splits > 1 && !plan.cluster) << "the rows must split through counters";
  ASSERT_TRUE(c.lse.defined());
  constexpr int kLaunches = 1000;
  // Each launch writes its own out and lse, poisoned (NaN) before any runs.
  std::vector<HostTensor*> outputs{&c.out, &c.lse};
  std::vector<std::unique_ptr<DeviceMemory>> slots;
  for (HostTensor* t : outputs) {
    slots.push_back(std::make_unique<DeviceMemory>(t->bytes.size() * kLaunches));
    ASSERT_CUDA(cudaMemset(slots.back()->get(), 0xff, slots.back()->bytes()));
  }
  ASSERT_GT(d.workspace_size, 0u);
  for (int i = 0; i < kLaunches; ++i) {
    // NaN partials before every other launch: one reading a partial before its split published
    // it would otherwise find the previous launch's, the same bits. The other launches follow
    // their predecessor with nothing between, so that they may start on its tail.
    if (i % 2 == 0) ASSERT_CUDA(cudaMemsetAsync(d.workspace->get(), 0xff, d.workspace_size));
    DecodeArgs a = d.args;
    a.out.data = static_cast<char*>(slots[0]->get()) + i * c.out.bytes.size();
    a.lse.data = static_cast<char*>(slots[1]->get()) + i * c.lse.bytes.size();
    sparse_mla_decode(a);
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const size_t bytes = outputs[k]->bytes.size();
    std::vector<std::byte> all(bytes * kLaunches);
    ASSERT_CUDA(cudaMemcpy(all.data(), slots[k]->get(), all.size(), cudaMemcpyDeviceToHost));
    for (int i = 1; i < kLaunches; ++i)
      ASSERT_EQ(std::memcmp(all.data(), all.data() + i * bytes, bytes), 0)
          << (k ? "lse" : "out") << " of launch " << i;
    std::memcpy(outputs[k]->bytes.data(), all.data(), bytes);  // the first launch's
  }
  EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(DType::bf16)));
  EXPECT_TRUE(all_zero(d.counter_values()));
  EXPECT_TRUE(d.guards_intact());
}

// `c` (its unattended rows poisoned) launched eagerly, then captured on a non-blocking stream
// and replayed `replays` times, its outputs poisoned before and fetched after each replay: each
// equals the eager launch bitwise; the eager outputs match the oracle and the counters end
// zeroed.
void expect_replays_equal_eager(DecodeCase& c, int replays) {
  SCOPED_TRACE(c.summary);
  DeviceCase d(c);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  sparse_mla_decode(d.args, stream);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  d.fetch(c);
  const DecodeCase eager = c;
  // Outputs poisoned again before each replay: each must write them all. The workspace too:
  // a replay reading a split's partial before it is published would otherwise find the last
  // replay's, bit for bit the same.
  const auto poison = [&] {
    d.poison_outputs(c, stream);
    ASSERT_CUDA(cudaMemsetAsync(d.workspace->get(), 0xff, d.workspace_size, stream));
  };

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  sparse_mla_decode(d.args, stream);
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < replays; ++i) {
    poison();
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    d.fetch(c);
    ASSERT_EQ(c.out.bytes, eager.out.bytes) << "replay " << i;
    ASSERT_EQ(c.lse.bytes, eager.lse.bytes) << "replay " << i;
  }
  EXPECT_TRUE(matches(eager, oracle(eager), Tolerance::device(c.query.dtype)));
  EXPECT_TRUE(all_zero(d.counter_values()));
  EXPECT_TRUE(d.guards_intact());
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

// A captured launch replayed 100 times equals the eager launch bitwise, with its split rows
// reduced in clusters and, the clusters off, through the counters (which each replay must
// leave zeroed for the next).
TEST(GpuDecode, GraphReplayEqualsEagerBitwise) {
  SKIP_WITHOUT_GPU();
  for (bool counters : {false, true}) {
    std::optional<CountersOnly> counters_only;
    if (counters) counters_only.emplace();
    DecodeCase c =
        make_case({.heads = 128, .requests = 2, .max_q = 3, .compressed_width = 512}, fresh_seed());
    poison_unattended_rows(c);
    const cuda::DecodePlan plan = DeviceCase(c).plan();
    ASSERT_GT(plan.num_splits, 1) << "the case must split rows";
    ASSERT_EQ(plan.cluster, !counters) << "the reduction under test";
    expect_replays_equal_eager(c, 100);
  }
}

// The backend caches occupancy per device and sets each kernel's shared-memory attribute before
// each launch: decodes before and after a cudaDeviceReset (split and unsplit plans, bf16 and
// fp8_ds_mla) stay right. Exits 0 when they did.
[[noreturn]] void decode_around_a_reset() {
  for (int round = 0; round < 2; ++round) {
    for (KvLayout layout : {KvLayout::bf16, KvLayout::fp8_ds_mla}) {
      const CaseSpec spec{
          .layout = layout, .heads = 64, .requests = 3, .max_q = 2, .compressed_width = 512};
      check_against_oracle_and_cpu(spec);
      check_reduced(spec, Reduction::unsplit);  // the TMA-query kernels' attribute too
    }
    if (round == 0 && cudaDeviceReset() != cudaSuccess) std::exit(2);
  }
  std::exit(testing::Test::HasFailure() ? 1 : 0);
}

// In a child process (threadsafe death-test style: it runs this test alone from a fresh start),
// so that the reset frees no other test's memory.
TEST(GpuDecode, DecodesAgainAfterADeviceReset) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(decode_around_a_reset(), testing::ExitedWithCode(0), "");
}

// A process's first decodes of each kernel (split and unsplit, every cache layout), launched
// inside a global-mode capture, as an engine that captures before its first eager step does:
// the kernels' first loads, attributes and the tensor-map encoder's lookup are all legal there,
// and so is the first decode's occupancy query (cudaFuncSetAttribute, then
// cudaOccupancyMaxActiveClusters) where no workspace was sized before: the first case has none
// and no counters (an engine that passes none); the later ones sized theirs (workspace_bytes).
// Replayed once into poisoned outputs, against the oracle. Exits 0 when all held.
[[noreturn]] void first_decodes_in_a_global_capture() {
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3}};
  for (const auto& [layout, query] : kinds)
    for (size_t split_bytes : {size_t{0}, SIZE_MAX}) {
      DecodeCase c = make_case({.layout = layout,
                                .query_dtype = query,
                                .heads = 64,
                                .q_lens = {2, 2},
                                .compressed_width = 512},
                               fresh_seed());
      SCOPED_TRACE(c.summary);
      poison_unattended_rows(c);
      DeviceCase d(c, split_bytes, split_bytes);
      cudaStream_t stream;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
          cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
        std::exit(2);
      EXPECT_NO_THROW(sparse_mla_decode(d.args, stream));
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      if (testing::Test::HasFailure()) std::exit(1);
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      d.poison_outputs(c, stream);
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      if (testing::Test::HasFailure()) std::exit(1);
      d.fetch(c);
      EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(query)));
      EXPECT_TRUE(all_zero(d.counter_values()));
      EXPECT_TRUE(d.guards_intact());
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
      CUDA_OK(cudaStreamDestroy(stream));
    }
  std::exit(testing::Test::HasFailure() ? 1 : 0);
}

TEST(GpuDecode, FirstDecodesOfAProcessInAGlobalCapture) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(first_decodes_in_a_global_capture(), testing::ExitedWithCode(0), "");
}

// Each device runs with its own occupancy and kernel attributes: split rows (in clusters and
// through the counters) and unsplit ones of every cache layout on the second device, then on the
// first, against the oracle and the CPU backend.
TEST(GpuDecode, DecodesOnEveryDevice) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3}};
  for (int device : {1, 0}) {
    const cuda::DeviceScope on(device);
    for (const auto& [layout, query] : kinds) {
      SCOPED_TRACE("cuda:" + std::to_string(device) + ", " + kv_layout_name(layout));
      const CaseSpec spec{.layout = layout, .query_dtype = query, .heads = 64, .q_lens = {2, 2},
                          .compressed_width = 512};
      const cuda::DecodePlan in_clusters = check_against_oracle_and_cpu(spec);
      EXPECT_TRUE(in_clusters.num_splits > 1 && in_clusters.cluster);
      EXPECT_GT(check_reduced(spec, Reduction::counters).num_splits, 1);
      check_reduced(spec, Reduction::unsplit);
      if (HasFailure()) return;
    }
  }
}

// Tensors on another device than the current one are refused before any launch; a stream of
// another device, whose launch fails, by name, with the launch's error taken off the thread's
// last-error state. Then the same call on a stream of its device decodes right. In a child
// process (exit code 0 when all held), so that a launch that ran after all cannot leave a
// sticky error to the tests after it.
[[noreturn]] void refuse_another_devices_tensors_and_stream() {
  const cuda::DeviceScope on(1);
  DecodeCase c = make_case({.heads = 64, .q_lens = {2, 2}, .compressed_width = 512}, fresh_seed());
  poison_unattended_rows(c);
  DeviceCase d(c);
  cudaStream_t foreign = nullptr;
  {
    const cuda::DeviceScope other(0);
    expect_smla_error([&] { sparse_mla_decode(d.args); }, ErrorKind::unsupported, "query",
                      "a tensor on the current CUDA device (cuda:0)", "cuda:1");
    CUDA_THROW(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));
  }
  expect_smla_error([&] { sparse_mla_decode(d.args, foreign); }, ErrorKind::value, "stream",
                    "a stream of cuda:1", "a stream of cuda:0");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  sparse_mla_decode(d.args);
  CUDA_THROW(cudaDeviceSynchronize());
  d.fetch(c);
  EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(DType::bf16)));
  std::exit(testing::Test::HasFailure() ? 1 : 0);
}

TEST(GpuDecode, AnotherDevicesTensorsOrStreamAreRefused) {
  SKIP_WITHOUT_TWO_GPUS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(refuse_another_devices_tensors_and_stream(), testing::ExitedWithCode(0), "");
}

// Too small a counter buffer or workspace, or none, falls back to fewer splits: still right.
// A byte short of what the full plan takes still splits (through those buffers, filled to the
// byte), so the reduction runs on the buffers' exact fit.
TEST(GpuDecode, SmallCountersOrWorkspaceFallBack) {
  SKIP_WITHOUT_GPU();
  const CountersOnly counters_only;
  enum Short { none, counters, workspace };
  for (Short shortened : {none, counters, workspace}) {
    DecodeCase c = make_case({.heads = 32, .requests = 2, .max_q = 2, .compressed_width = 1024},
                             fresh_seed());
    poison_unattended_rows(c);
    // Unlimited buffers split the rows (else nothing falls back); the given ones split fewer.
    const cuda::DecodePlan full =
        cuda::plan_decode(c.query.size(0), 32, c.sparse_indices.size(1), KvLayout::bf16,
                          cuda::decode_occupancy(0), SIZE_MAX, SIZE_MAX);
    ASSERT_GT(full.num_splits, 1) << c.summary;
    const size_t counter_bytes = shortened == none       ? 0
                                 : shortened == counters ? full.counter_bytes - 1
                                                         : SIZE_MAX,
                 ws_bytes = shortened == none        ? 0
                            : shortened == workspace ? full.workspace_bytes - 1
                                                     : SIZE_MAX;
    DeviceCase d(c, counter_bytes, ws_bytes);
    const std::string what = "counters " + std::to_string(d.counter_size) + " workspace " +
                             std::to_string(d.workspace_size) + "; " + c.summary;
    EXPECT_LT(d.plan().num_splits, full.num_splits) << what;
    if (shortened != none) ASSERT_GT(d.plan().num_splits, 1) << what;
    sparse_mla_decode(d.args);
    ASSERT_CUDA(cudaDeviceSynchronize());
    d.fetch(c);
    if (shortened != none) EXPECT_TRUE(d.workspace_written()) << what;
    EXPECT_TRUE(matches(c, oracle(c), Tolerance::device(DType::bf16))) << what;
    EXPECT_TRUE(all_zero(d.counter_values())) << what;
    EXPECT_TRUE(d.guards_intact()) << "bytes past the buffers given written; " << what;
  }
}

// Both fp8 layouts (and an e4m3 or bf16 query with the per-tensor one), with every e4m3 code
// and extreme UE8M0 exponents (0..2 and up to 2^(200-127): P.V sums in float32) on half of
// the cases. The e4m3 query's bound (its scores' rounding) would pass a kernel that drops an
// attended column in about a third of cases, so it runs on integer rows (CaseSpec::integer_fp8,
// exact scores) under bf16's bounds too.
TEST(GpuDecode, Fp8CachesAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  struct Kind {
    KvLayout layout;
    DType query;
    bool integer = false;
  };
  const Kind kinds[] = {{KvLayout::fp8_ds_mla, DType::bf16},
                        {KvLayout::fp8_e4m3, DType::f8e4m3},
                        {KvLayout::fp8_e4m3, DType::f8e4m3, true},
                        {KvLayout::fp8_e4m3, DType::bf16}};
  // Cases of each kind whose rows split in clusters, and through the counters (every other
  // case has clusters off).
  int in_clusters[std::size(kinds)] = {}, through_counters[std::size(kinds)] = {};
  int cases = 0;
  for (int round = 0; round < 2; ++round)
    for (size_t k = 0; k < std::size(kinds); ++k)
      for (int h : {1, 16, 64, 100, 128})
        for (int width : {4, 64, 512, 1024}) {  // 4: a last tile of 4 columns
          CaseSpec spec{.layout = kinds[k].layout,
                        .query_dtype = kinds[k].query,
                        .heads = h,
                        .compressed_width = width,
                        .extremes = round == 1 && !kinds[k].integer,
                        .top_exponent = 200,
                        .integer_fp8 = kinds[k].integer};
          spec.requests = h >= 64 ? 2 : 3;
          spec.max_q = 1 + (h + width) % 4;
          const cuda::DecodePlan plan =
              check_reduced(spec, cases++ % 2 ? Reduction::counters : Reduction::any);
          in_clusters[k] += plan.num_splits > 1 && plan.cluster;
          through_counters[k] += plan.num_splits > 1 && !plan.cluster;
          if (HasFailure()) return;
        }
  for (size_t k = 0; k < std::size(kinds); ++k) {
    const std::string kind = std::string(kv_layout_name(kinds[k].layout)) + " cache, " +
                             dtype_name(kinds[k].query) + " query" +
                             (kinds[k].integer ? ", integer rows" : "");
    EXPECT_GT(in_clusters[k], 0) << "cases split in clusters, " << kind;
    EXPECT_GT(through_counters[k], 0) << "cases split through the counters, " << kind;
  }
}

// fp8_ds_mla scale bytes on either side of 134, past which the conversion multiplies twice: a warp
// takes that path when any of its rows' scales needs it, so the extremes' mix (scales past 135
// in nearly every warp) would pass a kernel whose edge is off by one. Here every scale comes
// from one or two neighbouring bytes, split and unsplit plans.
TEST(GpuDecode, DsMlaScalesAroundTheSecondMultiply) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::vector<uint8_t>> sets = {{133, 134}, {134}, {135}, {134, 135}, {135, 136}};
  for (const auto& exponents : sets)
    for (int h : {16, 64})
      for (Reduction reduction : {Reduction::any, Reduction::unsplit}) {
        const CaseSpec spec{.layout = KvLayout::fp8_ds_mla,
                            .heads = h,
                            .compressed_width = 512,
                            .scale_exponents = exponents};
        check_reduced(spec, reduction);
        if (HasFailure()) return;
      }
}

// Scores spread wide, so that a row's max rises past the rescale threshold from tile to tile and
// every rescale of O (a warpgroup's own tile, the partner's base taken over) moves values that
// count: each layout and query, 16, 64 and 128 heads, split and unsplit plans. No sinks (see
// Decode.WideScores). An e4m3 query reads integer rows (CaseSpec::integer_fp8): e4m3 wgmma's
// scores would otherwise be off by 0.2 nats near 190, which moves a near tie's output by 10%.
TEST(GpuDecode, WideScoresRescaleAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3},
                                              {KvLayout::fp8_e4m3, DType::bf16}};
  for (const auto& [layout, query] : kinds)
    for (int h : {16, 64, 128})
      for (Reduction reduction : {Reduction::any, Reduction::unsplit}) {
        const CaseSpec spec{.layout = layout, .query_dtype = query, .heads = h, .requests = 3,
                            .max_q = 3, .compressed_width = 1024, .sinks = SinkKind::absent,
                            .score_spread = 40, .integer_fp8 = query == DType::f8e4m3};
        check_reduced(spec, reduction);  // unsplit: one CTA rescales over all 36 tiles
        if (HasFailure()) return;
      }
}

// Windows that are not a multiple of 4, so K reaching the kernel may not be one either (SPEC §1
// takes K or K - window a multiple of 4): every layout, split and unsplit plans.
TEST(GpuDecode, OddWindowsAgainstOracleAndCpu) {
  SKIP_WITHOUT_GPU();
  struct Widths {
    int window, compressed_width;
  };
  // K - window a multiple of 4 (K is not), then K a multiple of 4 (K - window is not).
  const Widths widths[] = {{6, 64}, {6, 2}, {7, 4}, {7, 1}, {130, 512}, {130, 1022}, {1, 3}};
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::bf16, DType::bf16},
                                              {KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3}};
  int cases = 0, split = 0;
  for (const auto& [layout, query] : kinds)
    for (const Widths& w : widths)
      for (int h : {8, 64, 128}) {
        CaseSpec spec{.layout = layout, .query_dtype = query, .heads = h,
                      .window = w.window, .compressed_width = w.compressed_width};
        spec.requests = h >= 64 ? 2 : 3;
        spec.max_q = 1 + cases % 4;
        split += check_against_oracle_and_cpu(spec).num_splits > 1;
        ++cases;
        if (HasFailure()) return;
      }
  EXPECT_GT(split, 0) << "split cases, of " << cases;
  EXPECT_LT(split, cases) << "every case split: no unsplit plan";
}

// fp8 launches split over many CTAs, reduced in clusters and through the counters, captured and
// replayed: bitwise equal to eager. Both kinds
// of fp8 kernel: fp8_ds_mla (converted to bf16) and e4m3 with an e4m3 query (f16).
TEST(GpuDecode, Fp8GraphReplayEqualsEagerBitwise) {
  SKIP_WITHOUT_GPU();
  const std::pair<KvLayout, DType> kinds[] = {{KvLayout::fp8_ds_mla, DType::bf16},
                                              {KvLayout::fp8_e4m3, DType::f8e4m3}};
  for (const auto& [layout, query] : kinds)
    for (bool counters : {false, true}) {
      std::optional<CountersOnly> counters_only;
      if (counters) counters_only.emplace();
      DecodeCase c = make_case({.layout = layout,
                                .query_dtype = query,
                                .heads = 64,
                                .requests = 1,
                                .max_q = 2,
                                .compressed_width = 1024},
                               fresh_seed());
      poison_unattended_rows(c);
      const cuda::DecodePlan plan = DeviceCase(c).plan();
      ASSERT_GT(plan.num_splits, 1) << "the case must split rows";
      ASSERT_EQ(plan.cluster, !counters) << "the reduction under test";
      expect_replays_equal_eager(c, 20);
    }
}

// Views the kernel cannot read or write aligned are refused by name before any launch (`out`
// shifted would meet `lse`, which the overlap check finds first).
TEST(GpuDecode, MisalignedViewsAreRefusedByName) {
  SKIP_WITHOUT_GPU();
  DecodeCase c = make_case({.heads = 16, .requests = 2, .max_q = 2, .compressed_width = 512},
                           fresh_seed());
  DeviceCase d(c);
  const DeviceMemory spare(4096);  // split buffers at offsets the kernel cannot take
  char* base = static_cast<char*>(spare.get());
  const auto buffer = [&](int64_t offset) {
    return make_view(base + offset, DType::u8, d.device, {1024});
  };
  const std::tuple<const char*, std::function<void(DecodeArgs&)>, const char*> cases[] = {
      {"workspace", [&](DecodeArgs& a) { a.workspace = buffer(4); },
       "data 4 bytes past a 16-byte boundary"},
      {"kv_counters", [&](DecodeArgs& a) { a.kv_counters = buffer(2048 + 2); },
       "data 2 bytes past a 4-byte boundary"},
      {"query", [](DecodeArgs& a) { a.query.data = static_cast<char*>(a.query.data) + 2; },
       "bf16["}};
  for (const auto& [name, change, got] : cases) {
    DecodeArgs args = d.args;
    change(args);  // no launch reads or writes the shifted views
    expect_smla_error([&] { sparse_mla_decode(args); }, ErrorKind::unsupported, name,
                      "-byte aligned", got);
  }
}

TEST(GpuDecode, CapabilityNamesWhatIsMissing) {
  SKIP_WITHOUT_GPU();
  const Device gpu{DeviceKind::cuda, 0};
  for (DType kv : {DType::bf16, DType::f8e4m3, DType::u8})
    EXPECT_TRUE(query_capability(512, DType::bf16, kv, 64, gpu).supported) << dtype_name(kv);
  EXPECT_TRUE(query_capability(512, DType::f8e4m3, DType::f8e4m3, 64, gpu).supported);
  const Capability mixed = query_capability(512, DType::f8e4m3, DType::u8, 64, gpu);
  EXPECT_FALSE(mixed.supported);
  EXPECT_NE(mixed.reason.find("u8"), std::string::npos) << mixed.reason;
  const Capability wide = query_capability(576, DType::bf16, DType::bf16, 64, gpu);
  EXPECT_FALSE(wide.supported);
  EXPECT_NE(wide.reason.find("576"), std::string::npos) << wide.reason;
  // decode() refuses fp8_ds_mla pages past 2^32 bytes of records: so does the query.
  const int most = static_cast<int>(UINT32_MAX / kDsMlaRecordBytes);
  EXPECT_TRUE(query_capability(512, DType::bf16, DType::u8, most, gpu).supported);
  const Capability huge = query_capability(512, DType::bf16, DType::u8, most + 1, gpu);
  EXPECT_FALSE(huge.supported);
  EXPECT_NE(huge.reason.find(std::to_string(most + 1)), std::string::npos) << huge.reason;
  EXPECT_TRUE(query_capability(512, DType::bf16, DType::bf16, most + 1, gpu).supported);
}

}  // namespace
}  // namespace smla::test
