// StepExecutor on CUDA (SPEC §5): a whole step equals per-layer direct calls bit for bit, a
// captured step replays bitwise with the graph SPEC §5 implies, and the tables' bookkeeping
// equals the CPU path's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "case_gen.h"
#include "cuda/backend.h"
#include "cuda/index.h"
#include "device_step.h"
#include "direct_call.h"
#include "error_check.h"
#include "oracle.h"
#include "ref_numeric.h"
#include "smla/error.h"
#include "smla/executor.h"
#include "step_case.h"

namespace smla::test {
namespace {

struct Pattern {
  const char* model;
  int groups;
  int first_layer, num_layers;  // a slice of the model's layers, MTP ones included
  CaseShape shape;
  friend std::ostream& operator<<(std::ostream& os, const Pattern& p) {
    return os << p.model << " layers " << p.first_layer << ".." << p.first_layer + p.num_layers - 1
              << ", " << p.groups << " SWA groups, " << kv_layout_name(p.shape.layout) << " pools";
  }
};

// MTP decode (q_len 1..3) with padding tokens.
CaseShape decode_shape(int groups) {
  return {.q_lens = {1, 3, 2},
          .seq_lens = {700, 300, 150},
          .num_decodes = 3,
          .num_groups = groups,
          .block_size = 64,
          .span = 80,
          .entries_per_page = 64,
          .compressed_span = 64,
          .invalid_fraction = 0.2};
}

// Decode and prefill requests in one step.
CaseShape mixed_shape(int groups) {
  return {.q_lens = {2, 1, 20},
          .seq_lens = {700, 150, 300},
          .num_decodes = 2,
          .num_groups = groups,
          .block_size = 64,
          .span = 64,
          .entries_per_page = 16,
          .compressed_span = 24};
}

// DSpark's window on the SWA-only MTP layers.
CaseShape dspark_shape(int groups) {
  return {.q_lens = {3, 3},
          .seq_lens = {500, 90},
          .num_decodes = 2,
          .num_groups = groups,
          .decode_swa_width = dspark_swa_width(kWindow, 3)};
}

// The pools of a step on 1, 2 and 3 SWA groups: bf16, fp8_ds_mla (V4's), per-tensor e4m3 (bf16
// queries).
constexpr KvLayout kGroupsLayout[] = {KvLayout::bf16, KvLayout::fp8_ds_mla, KvLayout::fp8_e4m3};

// Each model's slices on 1, 2 and 3 SWA groups, their pools kGroupsLayout's.
std::vector<Pattern> patterns() {
  std::vector<Pattern> all;
  for (int groups = 1; groups <= 3; ++groups) {
    all.push_back({"v4-flash", groups, 0, 44, decode_shape(groups)});
    all.push_back({"v4-pro", groups, 0, 12, mixed_shape(groups)});  // shortened: 2 + 5 x [4, 128]
    all.push_back({"v41-flash", groups, 0, 43, decode_shape(groups)});
    all.push_back({"v41-flash", groups, 40, 3, dspark_shape(groups)});
  }
  for (Pattern& p : all) p.shape.layout = kGroupsLayout[p.groups - 1];
  return all;
}

std::vector<LayerSpec> slice(const Pattern& p, int num_heads = 0) {
  const auto all = model_layers(model_preset(p.model), p.groups, true);
  std::vector<LayerSpec> specs(all.begin() + p.first_layer,
                               all.begin() + p.first_layer + p.num_layers);
  if (num_heads > 0)
    for (LayerSpec& s : specs) s.num_heads = num_heads;
  return specs;
}

// A pattern's step on the host (StepCase) and on the GPU: layers with sinks on every other one,
// random queries, and outs poisoned with NaN. A fresh seed each time (SMLA_TEST_SEED replays
// it): tests name it in a SCOPED_TRACE.
struct GpuStep {
  explicit GpuStep(const Pattern& p, int num_heads = 0)
      : seed(fresh_seed()), specs(slice(p, num_heads)), c(specs, p.shape, seed) {
    c.punch_topk_holes();  // the decodes' num_decodes then matters
    Rng rng(seed + 1);  // the sinks' own stream, so they do not shift the step's draws
    for (size_t i = 0; i < c.layers.size(); i += 2) {
      sinks.emplace_back(c.layers[i].spec.num_heads);
      // About the log of a row's sum (128+ columns of unit-spread scores: ~5), so they count.
      for (float& v : sinks.back()) v = static_cast<float>(rng.real(2, 8));
      c.layers[i].sinks = make_view(sinks.back().data(), DType::f32, Device{},
                                    {static_cast<int64_t>(sinks.back().size())});
    }
    const int64_t T = c.num_tokens();
    for (const AttentionLayer& l : c.layers) {
      host_queries.push_back(c.bf16(T, l.spec.num_heads));
      queries.push_back(gpu(host_queries.back()));
      outs.push_back(gpu.output(DType::bf16, {T, l.spec.num_heads, kHeadDim}, 0xff));
      max_columns = std::max(max_columns, sparse_index_columns(c.args(l.spec.layer)));
    }
    inputs = gpu(c.inputs);
    layers = gpu(c.layers);
  }

  // The number of distinct (SWA group, key) tables: what a step builds (with the top-k read by
  // the decode, only SWA tables).
  int distinct_tables(CompressedIndex compressed = CompressedIndex::automatic) const {
    std::set<TableKey> distinct;
    for (const LayerSpec& s : table_specs(specs, compressed, TableSharing::shared,
                                          every_entry_topk_width(specs, c.inputs), gpu.device))
      distinct.insert({s.swa_group, sparse_index_key(s)});
    return static_cast<int>(distinct.size());
  }

  // Zeroed device bytes; absent when none are asked for.
  TensorView zeroed(size_t bytes) {
    return bytes ? gpu.output(DType::u8, {static_cast<int64_t>(bytes)}, 0) : TensorView{};
  }

  std::vector<std::vector<std::byte>> out_bytes() const {
    std::vector<std::vector<std::byte>> all;
    for (const TensorView& o : outs) all.push_back(bytes_of(o));
    return all;
  }

  void poison_outs(cudaStream_t stream) const {
    for (const TensorView& o : outs)
      CUDA_THROW(cudaMemsetAsync(o.data, 0xff, extent_bytes(o), stream));
  }

  uint64_t seed;  // declared first: the step is made from it
  std::vector<LayerSpec> specs;
  StepCase c;
  std::list<std::vector<float>> sinks;
  DeviceMirror gpu;
  StepInputs inputs;
  std::vector<AttentionLayer> layers;
  std::vector<TensorView> host_queries, queries, outs;
  int64_t max_columns = 0;
};

// The CUDA streams, remembering each block allocate() serves (tables, the decodes' workspace;
// not the counters, which are allocate_persistent's), so that a test can poison them.
class BlockLoggingStreams final : public Streams {
 public:
  explicit BlockLoggingStreams(std::unique_ptr<Streams> inner) : inner_(std::move(inner)) {}
  Device device() const override { return inner_->device(); }
  void* current() const override { return inner_->current(); }
  void* side() const override { return inner_->side(); }
  void reserve_events(int count) override { inner_->reserve_events(count); }
  void fork() override { inner_->fork(); }
  void record(int event) override { inner_->record(event); }
  void wait(int event) override { inner_->wait(event); }
  void join() override { inner_->join(); }
  std::shared_ptr<void> allocate(size_t bytes) override {
    std::shared_ptr<void> memory = inner_->allocate(bytes);
    size_t& logged = blocks_[memory.get()];
    logged = std::max(logged, bytes);
    return memory;
  }
  std::shared_ptr<void> allocate_persistent(size_t bytes) override {
    return inner_->allocate_persistent(bytes);
  }
  void zero(void* dst, size_t bytes) override { inner_->zero(dst, bytes); }
  void upload(void* dst, const void* src, size_t bytes) override {
    inner_->upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    inner_->download(dst, src, bytes);
  }
  void synchronize() override { inner_->synchronize(); }

  // Every block served so far, 0xa5 bytes, on `stream`; how many.
  size_t poison_blocks(cudaStream_t stream) const {
    for (const auto& [block, bytes] : blocks_)
      CUDA_THROW(cudaMemsetAsync(block, 0xa5, bytes, stream));
    return blocks_.size();
  }

 private:
  std::unique_ptr<Streams> inner_;
  std::map<void*, size_t> blocks_;  // the most bytes each was served for
};

// The executor of a step on its own non-blocking stream.
struct StepOnStream {
  explicit StepOnStream(const GpuStep& g, CompressedIndex compressed = CompressedIndex::automatic)
      : streams(make_streams(g.gpu.device, stream.get())),
        executor(g.layers, streams, g.c.num_tokens(), g.max_columns, TableSharing::shared,
                 compressed) {}
  // One step of `g`, run and waited for: its outputs' bytes, every element written (the
  // outputs were poisoned with NaN), so that comparisons with them cannot pass on poison.
  std::vector<std::vector<std::byte>> eager_step(const GpuStep& g) {
    executor.run_step(g.inputs, g.queries, g.outs);
    stream.synchronize();
    auto bytes = g.out_bytes();
    for (size_t i = 0; i < bytes.size(); ++i)
      EXPECT_FALSE(any_bf16_nan(bytes[i].data(), bytes[i].size()))
          << "layer " << g.layers[i].spec.layer << ": an element not written";
    return bytes;
  }
  TestStream stream;  // declared first: made before the streams that use it
  BlockLoggingStreams streams;
  StepExecutor executor;
};

class GpuExecutor : public testing::TestWithParam<Pattern> {};

void step_equals_direct_calls(GpuStep& g, CompressedIndex compressed) {
  const char* mode = compressed_index_name(compressed);
  SCOPED_TRACE(test::seed_note(g.seed));
  StepOnStream on(g, compressed);
  const auto stepped = on.eager_step(g);
  TestStream& stream = on.stream;
  StepExecutor& executor = on.executor;

  g.poison_outs(stream.get());
  const int64_t T = g.c.num_tokens();
  for (size_t i = 0; i < g.layers.size(); ++i) {
    SparseIndexArgs a = g.gpu(g.c.args(g.layers[i].spec.layer));
    a.out = table_outputs(
        a, [&](DType d, std::initializer_list<int64_t> s) { return g.gpu.output(d, s); });
    build_sparse_indices(a, stream.get());
    DecodeArgs d = direct_decode_args(g.layers[i], a, g.queries[i], g.outs[i]);
    const int heads = g.layers[i].spec.num_heads;
    d.kv_counters = g.zeroed(kv_counter_bytes(T, heads));
    d.workspace =
        g.zeroed(workspace_bytes(T, heads, a.out.sparse_indices.size(1), g.gpu.device));
    sparse_mla_decode(d, stream.get());
  }
  stream.synchronize();
  const auto direct = g.out_bytes();
  for (size_t i = 0; i < g.layers.size(); ++i)
    EXPECT_TRUE(stepped[i] == direct[i]) << "layer " << g.layers[i].spec.layer << ", " << mode;

  int builds = 0;
  for (const auto& [key, count] : executor.tables().stats().builds) builds += count;
  EXPECT_EQ(builds, g.distinct_tables(compressed)) << mode;
}

// (b) Each layer by itself (its own table built on the GPU, sparse_mla_decode called directly
// with counters and workspace sized for that one launch) gives the executor's outputs bit for
// bit, whether it reads the top-k in the decode or SPEC §5's shared tables: the tables are the
// layers' own, and the shared buffers let every launch plan the splits it would plan alone.
TEST_P(GpuExecutor, StepEqualsDirectCallsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (CompressedIndex compressed :
       {CompressedIndex::automatic, CompressedIndex::topk, CompressedIndex::table}) {
    GpuStep g(GetParam());
    step_equals_direct_calls(g, compressed);
  }
}

// The step's layers reading every compressed entry get their top-k padded with -1 to `width`
// columns (the same entries attended), on the host and the device; max_columns follows, so that
// an executor made after it sizes its workspace as the direct calls size theirs.
void widen_every_entry_topk(GpuStep& g, int64_t width) {
  const int64_t T = g.c.num_tokens();
  for (const LayerSpec& s : g.specs) {
    if (s.compress_ratio == 0 || s.index_topk > 0) continue;
    TensorView& topk = g.c.inputs.topk_indices.at(s.index_source);
    if (topk.size(1) >= width) continue;
    TensorView wide = g.c.zeros(DType::i32, {T, width});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < width; ++j)
        wide.ptr<int32_t>()[t * width + j] =
            j < topk.size(1) ? topk.ptr<const int32_t>()[t * topk.stride(0) + j] : -1;
    topk = wide;
  }
  g.inputs = g.gpu(g.c.inputs);
  for (const AttentionLayer& l : g.c.layers)
    g.max_columns = std::max(g.max_columns, sparse_index_columns(g.c.args(l.spec.layer)));
}

// A top-k wider than the decode reads (2048 columns: V4's ratio-128 layers past ~262K tokens,
// here padded with -1): in such a step automatic mode reads those layers' columns from built
// tables, bit for bit their direct calls, switching plans with the step on one executor; topk
// mode refuses the step before any launch. One exactly 2048 wide the decode still reads.
TEST(GpuExecutorWideTopk, StepsPastTheDecodesWidthReadTables) {
  SKIP_WITHOUT_GPU();
  const Pattern p{"v4-flash", 1, 0, 6, decode_shape(1)};  // two ratio-128 layers: 3 and 5
  const int64_t width = max_topk_width(current_gpu()) + 256;
  for (CompressedIndex compressed : {CompressedIndex::automatic, CompressedIndex::table}) {
    GpuStep g(p);
    widen_every_entry_topk(g, width);
    step_equals_direct_calls(g, compressed);
  }
  GpuStep g(p);
  SCOPED_TRACE(test::seed_note(g.seed));
  StepOnStream on(g);
  const auto builds = [&] {
    int n = 0;
    for (const auto& [key, count] : on.executor.tables().stats().builds) n += count;
    return n;
  };
  on.eager_step(g);  // narrow: every V4 layer reads its top-k, one SWA table
  EXPECT_EQ(builds(), g.distinct_tables());
  const int narrow_builds = builds();
  const StepInputs narrow = g.inputs, narrow_host = g.c.inputs;
  widen_every_entry_topk(g, width);
  on.eager_step(g);  // wide: the two ratio-128 layers' tables too
  EXPECT_EQ(builds(), g.distinct_tables());
  EXPECT_EQ(builds(), narrow_builds + 2);
  g.inputs = narrow, g.c.inputs = narrow_host;
  on.eager_step(g);  // and back
  EXPECT_EQ(builds(), narrow_builds);
  widen_every_entry_topk(g, max_topk_width(current_gpu()));
  on.eager_step(g);  // the widest the decode reads: no table more than the narrow step's
  EXPECT_EQ(builds(), narrow_builds);
  g.inputs = narrow, g.c.inputs = narrow_host;
  widen_every_entry_topk(g, width);
  StepOnStream topk(g, CompressedIndex::topk);
  test::expect_smla_error(
      [&] { topk.executor.run_step(g.inputs, g.queries, g.outs); }, ErrorKind::unsupported,
      "topk_indices[" + std::to_string(g.c.layers[3].spec.index_source) + "]",
      ", compressed_index \"topk\")", std::to_string(width) + " columns for layers[3] (layer 3)");
}

// (c) The step captured on a non-default stream after one eager step, replayed 10 times, equals
// the eager step bitwise; its graph is one table build per distinct (group, key), one decode
// per layer, and no memset, memcpy or allocation node. Before each replay its tables and
// workspace are poisoned, so that a decode reading a table before its (forked) build has
// rewritten it, an edge missing from the graph, fails.
TEST_P(GpuExecutor, CapturedStepReplaysBitwise) {
  SKIP_WITHOUT_GPU();
  GpuStep g(GetParam());
  SCOPED_TRACE(test::seed_note(g.seed));
  StepOnStream on(g);
  const auto eager = on.eager_step(g);
  TestStream& stream = on.stream;
  StepExecutor& executor = on.executor;
  const TableStats eager_stats = executor.tables().stats();

  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  executor.run_step(g.inputs, g.queries, g.outs);
  ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  EXPECT_EQ(executor.tables().stats().builds, eager_stats.builds);
  EXPECT_EQ(executor.tables().stats().forks, eager_stats.forks);

  size_t count = 0;
  ASSERT_CUDA(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  ASSERT_CUDA(cudaGraphGetNodes(graph, nodes.data(), &count));
  int table_builds = 0, decodes = 0, other_kernels = 0;
  std::map<int, int> others;  // by node type
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    ASSERT_CUDA(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams params{};
      ASSERT_CUDA(cudaGraphKernelNodeGetParams(node, &params));
      // A decode kernel per layout and per compressed-column source (table or top-k).
      if (params.func == cuda::index_kernel())
        ++table_builds;
      else if (cuda::is_decode_kernel(params.func))
        ++decodes;
      else
        ++other_kernels;
    } else {
      ++others[static_cast<int>(type)];
    }
  }
  const int builds = g.distinct_tables(), layers = static_cast<int>(g.layers.size());
  EXPECT_EQ(table_builds, builds) << "table builds";
  EXPECT_EQ(decodes, layers) << "decode launches";
  EXPECT_EQ(other_kernels, 0) << "kernels that are neither table builds nor decodes";
  for (const auto& [type, n] : others)
    EXPECT_EQ(type, static_cast<int>(cudaGraphNodeTypeEmpty)) << n << " nodes of type " << type;

  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 10; ++replay) {
    g.poison_outs(stream.get());
    ASSERT_GE(on.streams.poison_blocks(stream.get()), size_t{1}) << "no table was served";
    ASSERT_CUDA(cudaGraphLaunch(exec, stream.get()));
    stream.synchronize();
    const auto replayed = g.out_bytes();
    for (size_t i = 0; i < g.layers.size(); ++i)
      ASSERT_TRUE(replayed[i] == eager[i])
          << "replay " << replay << ", layer " << g.layers[i].spec.layer;
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuExecutor, testing::ValuesIn(patterns()), [](const auto& info) {
  const Pattern& p = info.param;
  std::string name = p.model;
  std::erase(name, '-');
  return name + "_layers" + std::to_string(p.first_layer) + "to" +
         std::to_string(p.first_layer + p.num_layers - 1) + "_" + std::to_string(p.groups) +
         "groups_" + kv_layout_name(p.shape.layout);
});

// Whether a GPU output's bytes are within `tol` of the CPU's output `cpu` (host, contiguous,
// [T, H, 512] bf16), as matches() holds a backend to the oracle: |gpu - cpu| <= out_rtol |cpu|
// + out_atol x the (token, head) row's max |cpu|. NaN on either side never passes.
testing::AssertionResult near_cpu(const std::vector<std::byte>& gpu, const TensorView& cpu,
                                  Tolerance tol) {
  if (gpu.size() != extent_bytes(cpu))
    return testing::AssertionFailure() << gpu.size() << " bytes, the CPU's " << extent_bytes(cpu);
  const auto* want = static_cast<const uint16_t*>(cpu.data);
  std::ostringstream bad;
  int64_t mismatches = 0;
  for (int64_t row = 0; row < cpu.size(0) * cpu.size(1); ++row) {
    double row_max = 0;
    for (int d = 0; d < kHeadDim; ++d)
      row_max = std::max(row_max, std::abs(ref_bf16(want[row * kHeadDim + d])));
    for (int d = 0; d < kHeadDim; ++d) {
      const int64_t i = row * kHeadDim + d;
      uint16_t bits;
      std::memcpy(&bits, gpu.data() + 2 * i, 2);
      const double got = ref_bf16(bits), ref = ref_bf16(want[i]);
      if (!(std::abs(got - ref) <= tol.out_rtol * std::abs(ref) + tol.out_atol * row_max) &&
          mismatches++ < 8)
        bad << "\n  out[" << row / cpu.size(1) << "," << row % cpu.size(1) << "," << d
            << "] = " << fmt(got) << ", CPU " << fmt(ref);
    }
  }
  if (mismatches == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << mismatches << " mismatches with the CPU" << bad.str();
}

// (d) The same step's table bookkeeping through the CUDA path equals the CPU path's: builds,
// forks in order, waiting layers, tables per group, bytes. Two steps: reset() starts afresh.
// Each GPU step's outputs (poisoned before it) match the CPU's within the device tolerance, on
// every layout of pool (kGroupsLayout).
TEST(GpuTables, BookkeepingEqualsTheCpuPath) {
  SKIP_WITHOUT_GPU();
  for (const char* model : {"v4-flash", "v4-pro", "v41-flash"})
    for (int groups = 1; groups <= 3; ++groups) {
      const int all = static_cast<int>(model_layers(model_preset(model), groups, true).size());
      Pattern p{model, groups, 0, all, decode_shape(groups)};
      p.shape.layout = kGroupsLayout[groups - 1];
      GpuStep g(p, 4);  // few heads: the CPU decodes the step too
      SCOPED_TRACE(test::seed_note(g.seed));
      const auto cpu_streams = make_streams(Device{});
      StepExecutor cpu(g.c.layers, *cpu_streams, g.c.num_tokens(), g.max_columns);
      std::vector<TensorView> host_outs;
      for (const TensorView& q : g.host_queries) {
        // NaN (0xffff) until the CPU writes them: an element it leaves fails the comparison.
        host_outs.push_back(g.c.zeros(DType::bf16, {q.size(0), q.size(1), kHeadDim}));
        std::memset(host_outs.back().data, 0xff, extent_bytes(host_outs.back()));
      }
      cpu.run_step(g.c.inputs, g.host_queries, host_outs);

      TestStream stream;
      const auto streams = make_streams(g.gpu.device, stream.get());
      StepExecutor gpu(g.layers, *streams, g.c.num_tokens(), g.max_columns);
      for (int step = 0; step < 2; ++step) {
        g.poison_outs(stream.get());  // so that step 1 must write its outputs too
        gpu.run_step(g.inputs, g.queries, g.outs);
        stream.synchronize();
        const TableStats &want = cpu.tables().stats(), &got = gpu.tables().stats();
        const std::string where = std::string(model) + ", " + std::to_string(groups) + " groups, " +
                                  kv_layout_name(p.shape.layout) + " pools, step " +
                                  std::to_string(step);
        EXPECT_EQ(got.builds, want.builds) << where;
        EXPECT_EQ(got.forks, want.forks) << where;
        EXPECT_EQ(got.waits, want.waits) << where;
        EXPECT_EQ(got.peak_tables, want.peak_tables) << where;
        EXPECT_EQ(got.bytes, want.bytes) << where;
        EXPECT_EQ(got.peak_bytes, want.peak_bytes) << where;
        // The step's query is bf16 (StepCase).
        const auto outs = g.out_bytes();
        for (size_t i = 0; i < outs.size(); ++i)
          EXPECT_TRUE(near_cpu(outs[i], host_outs[i], Tolerance::device(DType::bf16)))
              << where << ", layer " << g.layers[i].spec.layer;
      }
    }
}

// A capture before any eager step would allocate device memory: it fails, saying what to do,
// and leaves the stream usable.
TEST(GpuTables, CaptureBeforeAnEagerStepSaysSo) {
  SKIP_WITHOUT_GPU();
  GpuStep g({"v4-flash", 2, 0, 6, decode_shape(2)});
  SCOPED_TRACE(test::seed_note(g.seed));
  StepOnStream on(g);
  TestStream& stream = on.stream;
  StepExecutor& executor = on.executor;
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  try {
    executor.run_step(g.inputs, g.queries, g.outs);
    ADD_FAILURE() << "a step was captured without an eager step first";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find("eager step"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  if (graph) CUDA_OK(cudaGraphDestroy(graph));
  executor.run_step(g.inputs, g.queries, g.outs);  // eager now: fine
  stream.synchronize();
}

// Streams (an executor's, tables') made on a capturing stream: refused, naming the stream, and
// the capture stays valid (asking a capturing stream for its device would invalidate it).
TEST(GpuTables, StreamsMadeDuringACaptureAreRefused) {
  SKIP_WITHOUT_GPU();
  TestStream stream;
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  test::expect_smla_error([&] { make_streams({DeviceKind::cuda, 0}, stream.get()); },
                          ErrorKind::unsupported, "stream", "a stream that is not capturing",
                          "a capturing stream");
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  ASSERT_NE(graph, nullptr);
  CUDA_OK(cudaGraphDestroy(graph));
  EXPECT_NO_THROW(make_streams({DeviceKind::cuda, 0}, stream.get()));
  // The legacy stream while a blocking stream captures: its work would join that capture
  // (cudaStreamIsCapturing answers cudaErrorStreamCaptureImplicit), so it counts as capturing.
  TestStream blocking(true);
  ASSERT_CUDA(cudaStreamBeginCapture(blocking.get(), cudaStreamCaptureModeThreadLocal));
  test::expect_smla_error(
      [&] {
        make_streams({DeviceKind::cuda, 0}, nullptr);
      },
      ErrorKind::unsupported, "stream", "a stream that is not capturing", "a capturing stream");
  graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(blocking.get(), &graph));
  ASSERT_NE(graph, nullptr);
  CUDA_OK(cudaGraphDestroy(graph));
  EXPECT_NO_THROW(make_streams({DeviceKind::cuda, 0}, nullptr));
}

// What a capture cannot hold (a memset rerun on every replay; a wait for the stream) is refused
// by name before any CUDA call, and the capture stays valid; after it, each works.
TEST(GpuTables, StreamsRefuseWaitsAndMemsetsDuringACapture) {
  SKIP_WITHOUT_GPU();
  TestStream stream;
  const auto streams = make_streams({DeviceKind::cuda, 0}, stream.get());
  const std::shared_ptr<void> device = streams->allocate(64);
  std::vector<std::byte> host(64, std::byte{7});
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  const std::pair<const char*, std::function<void()>> calls[] = {
      {"zero", [&] { streams->zero(device.get(), 64); }},
      {"upload", [&] { streams->upload(device.get(), host.data(), 64); }},
      {"download", [&] { streams->download(host.data(), device.get(), 64); }},
      {"synchronize", [&] { streams->synchronize(); }}};
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    try {
      call();
      ADD_FAILURE() << "ran during a capture";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported);
      EXPECT_EQ(e.argument(), name);
      EXPECT_EQ(e.got(), "a capturing stream");
    }
  }
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  ASSERT_NE(graph, nullptr);
  CUDA_OK(cudaGraphDestroy(graph));
  streams->zero(device.get(), 64);
  streams->download(host.data(), device.get(), 64);
  EXPECT_EQ(host, std::vector<std::byte>(64));
  std::vector<std::byte> ones(64, std::byte{1});
  streams->upload(device.get(), ones.data(), 64);
  streams->download(host.data(), device.get(), 64);
  EXPECT_EQ(host, ones);
}

// A step whose memory, streams and executor live on the second device, run while it is
// current, equals the direct calls there bit for bit; streams for it around a stream of the
// first device are refused by name.
TEST(GpuTables, StepOnTheSecondDevice) {
  SKIP_WITHOUT_TWO_GPUS();
  const cuda::DeviceScope on(1);
  GpuStep g({"v41-flash", 3, 0, 43, decode_shape(3)});
  step_equals_direct_calls(g, CompressedIndex::automatic);
  const cuda::DeviceScope first(0);
  TestStream foreign;
  test::expect_smla_error([&] { make_streams({DeviceKind::cuda, 1}, foreign.get()); },
                          ErrorKind::value, "stream", "a stream of cuda:1", "a stream of cuda:0");
}

// A run_layer refused after its lookup forked, inside a capture: it joins before throwing, so
// the capture still ends (unjoined side-stream work would fail cudaStreamEndCapture instead).
TEST(GpuTables, RunLayerFailingInACaptureLeavesItJoined) {
  SKIP_WITHOUT_GPU();
  GpuStep g({"v41-flash", 3, 0, 6, decode_shape(3)});
  SCOPED_TRACE(test::seed_note(g.seed));
  StepOnStream on(g);
  on.eager_step(g);  // the capture's blocks
  TestStream& stream = on.stream;
  StepExecutor& executor = on.executor;
  TensorView query = g.queries[0];
  query.dtype = DType::u8;
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  executor.begin_step(g.inputs);
  test::expect_smla_error([&] { executor.run_layer(g.layers[0].spec.layer, query, g.outs[0]); },
                          ErrorKind::type, "query", "bf16", "u8");
  EXPECT_FALSE(executor.tables().stats().forks.empty()) << "the lookup forked nothing";
  CUDA_OK(cudaStreamEndCapture(stream.get(), &graph));
  if (graph) CUDA_OK(cudaGraphDestroy(graph));
  executor.end_step();
}

// A pool the kernel cannot read (rows not 16-byte aligned): the step fails with the decode's
// error, joined.
TEST(GpuTables, UnreadablePoolFailsWithTheDecodeError) {
  SKIP_WITHOUT_GPU();
  GpuStep g({"v4-flash", 1, 0, 4, decode_shape(1)});
  SCOPED_TRACE(test::seed_note(g.seed));
  for (AttentionLayer& l : g.layers)
    l.swa_kv_cache.data = static_cast<char*>(l.swa_kv_cache.data) + 2;  // one bf16 off
  StepOnStream on(g);
  TestStream& stream = on.stream;
  StepExecutor& executor = on.executor;
  try {
    executor.run_step(g.inputs, g.queries, g.outs);
    ADD_FAILURE() << "a misaligned pool ran on CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_EQ(e.argument(), "swa_kv_cache");
  }
  stream.synchronize();
}

}  // namespace
}  // namespace smla::test
