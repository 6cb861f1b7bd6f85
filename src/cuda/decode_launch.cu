// Host side of the decode kernel: plan, check what the kernel assumes, fill params, launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/tensor_map.h"

namespace smla::cuda {
namespace {

PoolParams pool_params(const KvPool& pool, const char* name) {
  require(aligned(pool.base, 16) && pool.token_stride_bytes % 16 == 0 &&
              pool.block_stride_bytes % 16 == 0,
          name, "16-byte aligned rows on CUDA", [&] {
            return "base " + std::to_string(reinterpret_cast<uintptr_t>(pool.base) % 16) +
                   " mod 16, strides " + std::to_string(pool.token_stride_bytes) + "/" +
                   std::to_string(pool.block_stride_bytes) + " B";
          });
  PoolParams p;
  p.base = reinterpret_cast<const char*>(pool.base);
  p.token_stride_bytes = pool.token_stride_bytes;
  p.block_stride_bytes = pool.block_stride_bytes;
  // Offsets are int32: every one up to 2^31 - 1 is a row of a pool that large.
  p.rows = uint32_t(std::min<int64_t>(pool.rows(), int64_t(1) << 31));
  p.span = FastDiv(uint32_t(pool.span));  // below 2^31 (make_pool)
  p.block_size = uint32_t(pool.block_size);
  if (pool.layout == KvLayout::fp8_ds_mla) {
    require(pool.block_size * kDsMlaRecordBytes <= UINT32_MAX, name,
            "fp8_ds_mla pages of at most 2^32 bytes of records on CUDA",
            [&] { return std::to_string(pool.block_size) + " rows a page"; });
    p.scales_offset_bytes = uint32_t(pool.block_size * kDsMlaRecordBytes);
  }
  return p;
}

// `unread`: a device pointer for a top-k of no entries ([T, 0], whose data may be null): the
// kernels tell a top-k from a table by `indices`, and read none of its entries.
TopkParams topk_params(const TopkColumns& c, const DecodeProblem& problem, const int32_t* unread) {
  require(problem.top_k <= kMaxTopk, "topk_columns.topk_indices",
          [] { return "[T, top_k] with top_k <= " + std::to_string(kMaxTopk) + " on CUDA"; },
          [&] { return describe(c.topk_indices); });
  require(c.block_table.size(1) <= INT32_MAX, "topk_columns.block_table",
          "at most 2^31 - 1 pages on CUDA", [&] { return describe(c.block_table); });
  TopkParams t{};
  t.indices = c.topk_indices.data ? c.topk_indices.ptr<const int32_t>() : unread;
  t.stride = c.topk_indices.stride(0);
  t.top_k = int(problem.top_k);
  t.block_table = c.block_table.ptr<const int32_t>();
  t.table_stride = c.block_table.stride(0);
  t.pages = int(c.block_table.size(1));
  t.is_valid = c.is_valid_token.defined() ? c.is_valid_token.ptr<const uint8_t>() : nullptr;
  t.valid_stride = c.is_valid_token.defined() ? c.is_valid_token.stride(0) : 0;
  t.num_decodes = int(c.num_decodes);
  t.compress_ratio = c.compress_ratio;
  return t;
}

// The query [T, H, 512] (bf16, or e4m3 for kF16) as a TMA tensor read in boxes of 8 heads x
// 128 bytes, as the wgmma read it; heads past H arrive as zeros. False where TMA cannot take
// its strides.
bool query_map(const TensorView& q, const DecodeProblem& problem, CUtensorMap* map) {
  const bool e4m3 = problem.query_dtype == DType::f8e4m3;
  const uint64_t element = e4m3 ? 1 : 2;
  // A dimension of size 1 is read at index 0 alone: any stride serves.
  const auto stride = [&](int dim) {
    return uint64_t(q.size(dim) == 1 ? 512 * element : q.stride(dim) * element);
  };
  // TMA strides are 16-byte multiples below 2^40 bytes (the launcher checked 16-byte multiples
  // for bf16, 8-byte ones for e4m3; a negative stride, read unsigned, is above): other views
  // take the cp.async kernels without asking the driver, whose refusal compute-sanitizer would
  // report as an error.
  for (int dim : {0, 1})
    if (stride(dim) >= (uint64_t(1) << 40) || stride(dim) % 16 != 0) return false;
  const uint64_t dims[3] = {512, uint64_t(problem.num_heads), uint64_t(problem.num_tokens)};
  const uint64_t strides[2] = {stride(1), stride(0)};
  const uint32_t box[3] = {uint32_t(128 / element), 8, 1};
  return tensor_map(map, q.data, e4m3, 3, dims, strides, box, "query");
}

// A query of at least kQueryEvictFirstBytes goes to L2 as evicted first where the rows do
// (stream_rows), being read once too. Against plain copies on an H200 (forty-seventh session),
// 2 tokens a request: bf16 H=64 at 96 / 128 / 192 / 256 requests (12-32 MiB of query) 0.992 /
// 0.953 / 0.947 / 0.979, an e4m3 query at 256 requests (16 MiB) 0.988; at 4-8 MiB 1.006-1.014
// (bf16 H=64 at 64 requests or one token a request, H=16/32 at 128; e4m3 at 128). The reason is
// not analysed (a smaller query likely stays in L2 across the benchmark's launches, which
// reuse it).
//
// Unsplit plans of 64 heads a CTA read the query by TMA where a map holds its view (`tp` then
// has it); other views take the cp.async kernel of the same plan.
bool query_by_tma(const DecodePlan& plan, const TensorView& q, const DecodeProblem& problem,
                  const Occupancy& occupancy, QueryTmaParams& tp) {
  tp.wave_ctas = occupancy.ctas;
  tp.query_evict_first = int64_t(problem.num_tokens) * problem.num_heads * 512 *
                             dtype_size(problem.query_dtype) >=
                         kQueryEvictFirstBytes;
  return plan.num_splits == 1 && plan.heads_per_cta == kMmaRows && query_map(q, problem, &tp.q_map);
}

// Sets the kernel's shared-memory size on the current device, before each launch or query: the
// setting belongs to the device's context, which a cudaDeviceReset may replace (this driver
// keeps it, others have not), and a call costs ~240 ns on an H200 against ~3.4 us a launch.
// Clusters past the portable size need one more.
template <KvLayout L, bool kTopk, bool kF16, bool kQueryTma = false>
void allow_large_smem(int cluster = 1) {
  const auto kernel = decode_kernel<L, kTopk, kF16, kQueryTma>;
  SMLA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<L>));
  if (cluster > kPortableClusterCtas)
    SMLA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

// The kernels: per cache layout, reading a table or (kTopk) a top-k, for an e4m3 cache with an
// e4m3 query (kF16) the f16 ones, and for bf16, fp8_ds_mla and kF16 and an unsplit plan
// (kQueryTma) those that read the query by TMA: only these fourteen are built.
template <KvLayout L, bool kTopk, bool kF16, bool kQueryTma>
void launch(const KernelParams<kQueryTma>& p, int64_t ctas, cudaStream_t stream) {
  allow_large_smem<L, kTopk, kF16, kQueryTma>(p.cluster ? p.num_splits : 1);
  launch_early("the decode kernel", decode_kernel<L, kTopk, kF16, kQueryTma>,
               dim3(unsigned(ctas)), dim3(kThreads), kSmemBytes<L>, stream,
               p.cluster ? p.num_splits : 1, p);
}

template <KvLayout L, bool kF16, bool kQueryTma = false>
void launch(const KernelParams<kQueryTma>& p, int64_t ctas, cudaStream_t stream) {
  if (p.topk.indices)
    launch<L, true, kF16, kQueryTma>(p, ctas, stream);
  else
    launch<L, false, kF16, kQueryTma>(p, ctas, stream);
}

template <KvLayout L, bool kF16 = false, bool kQueryTma = false>
bool is_layout_kernel(const void* func) {
  return func == reinterpret_cast<const void*>(&decode_kernel<L, false, kF16, kQueryTma>) ||
         func == reinterpret_cast<const void*>(&decode_kernel<L, true, kF16, kQueryTma>);
}

// Token and head strides of whole 8-element units. A dim of size 1 is only read at index 0,
// whatever its stride (DLPack exporters may rewrite such strides, PyTorch up to 2.9 to 1).
bool rows_aligned(const TensorView& v) {
  for (int dim : {0, 1})
    if (v.size(dim) > 1 && v.stride(dim) % 8 != 0) return false;
  return true;
}

size_t bytes_of(const TensorView& v) {
  return v.defined() ? size_t(v.numel()) * dtype_size(v.dtype) : 0;
}

std::atomic<bool> cluster_reduction{true};

}  // namespace

void use_cluster_reduction(bool enabled) { cluster_reduction.store(enabled); }

Occupancy decode_occupancy(int device) {
  // Every decode kernel takes a whole SM (its shared memory), so one kernel's answer holds for all.
  static PerDevice<std::array<std::atomic<int>, kMaxClusterSplits + 1>> cache;
  Occupancy o;
  o.ctas = sm_count(device);
  o.dram_bytes_per_us = dram_bytes_per_us(device);
  if (!cluster_reduction.load()) return o;
  auto& cached = cache.at(device);
  for (int c = 2; c <= kMaxClusterSplits; ++c) {
    int clusters = cached[c].load(std::memory_order_relaxed);
    if (clusters == 0) {
      const DeviceScope scope(device);  // the attribute and the query act on the current device
      allow_large_smem<KvLayout::bf16, false, false>(c);
      cudaLaunchAttribute attr = cluster_attribute(c);
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(c));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = kSmemBytes<KvLayout::bf16>;
      config.attrs = &attr;
      config.numAttrs = 1;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(
          &clusters, decode_kernel<KvLayout::bf16, false, false, false>, &config);
      // A size this device refuses (a non-portable one, say) is a size no cluster plan takes.
      if (e == cudaErrorInvalidClusterSize) {
        (void)cudaGetLastError();
        clusters = 0;
      } else {
        check(e, "cudaOccupancyMaxActiveClusters");
      }
      clusters = std::max(clusters, 0) + 1;  // cached + 1, so that 0 means not yet asked
      cached[c].store(clusters, std::memory_order_relaxed);
    }
    o.cluster_ctas[c] = (clusters - 1) * c;
  }
  return o;
}

size_t kv_counter_bytes(int64_t max_tokens, int num_heads) {
  // Enough for the finest head blocks a plan may pick.
  return size_t(max_tokens) * ((num_heads + kMinHeadsPerCta - 1) / kMinHeadsPerCta) *
         sizeof(int32_t);
}

size_t workspace_bytes(int64_t max_tokens, int num_heads, int64_t max_columns, int device) {
  require_supported(device);
  // The occupancy query (cached per device) and the kernel attribute it sets act on the current
  // device: `device` must be current for them.
  const DeviceScope scope(device);
  return workspace_bound(max_tokens, num_heads, max_columns, decode_occupancy(device));
}

bool is_decode_kernel(const void* func) {
  return is_layout_kernel<KvLayout::bf16>(func) ||
         is_layout_kernel<KvLayout::bf16, false, true>(func) ||
         is_layout_kernel<KvLayout::fp8_e4m3>(func) ||
         is_layout_kernel<KvLayout::fp8_e4m3, true>(func) ||
         is_layout_kernel<KvLayout::fp8_e4m3, true, true>(func) ||
         is_layout_kernel<KvLayout::fp8_ds_mla>(func) ||
         is_layout_kernel<KvLayout::fp8_ds_mla, false, true>(func);
}

void decode(const DecodeProblem& problem, const DecodeArgs& args, void* stream) {
  const int device = problem.device.id;
  require_usable(problem.device, "query");
  if (problem.num_tokens == 0) return;

  // Rows of 8-element units: 16 bytes for a bf16 query, 8 for an e4m3 one.
  const TensorView& q = args.query;
  const bool q_fp8 = problem.query_dtype == DType::f8e4m3;
  require(aligned(q.data, 16) && rows_aligned(q), "query",
          q_fp8 ? "8-byte aligned rows on CUDA (16-byte aligned start)"
                : "16-byte aligned rows on CUDA",
          [&] { return describe(q); });
  require(aligned(args.out.data, 16) && rows_aligned(args.out), "out",
          "16-byte aligned rows on CUDA", [&] { return describe(args.out); });

  const size_t workspace_have = bytes_of(args.workspace);
  const size_t counters_have = bytes_of(args.kv_counters);
  require_aligned(args.workspace, "workspace", 16);
  require_aligned(args.kv_counters, "kv_counters", 4);
  // Too small a workspace or counter buffer only limits splitting (SPEC §3: fall back).
  const Occupancy occupancy = decode_occupancy(device);
  const DecodePlan plan = plan_decode(problem.num_tokens, problem.num_heads, problem.num_columns,
                                      problem.layout, occupancy, workspace_have, counters_have);

  // The kernel counts CTAs and a token's output chunks in int.
  require(plan.ctas <= INT32_MAX, "query", "at most 2^31 - 1 CTAs (tokens x head blocks) on CUDA",
          [&] {
            return std::to_string(problem.num_tokens) + " tokens, " + std::to_string(plan.ctas) +
                   " CTAs";
          });
  require(problem.out_heads <= INT32_MAX / kRowChunks, "out",
          [] { return "H_out below 2^31 / " + std::to_string(kRowChunks) + " on CUDA"; },
          [&] { return std::to_string(problem.out_heads); });
  DecodeParams p{};
  p.query = q.data;
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.swa = pool_params(problem.swa, "swa_kv_cache");
  p.compressed = pool_params(problem.compressed, "compressed_kv_cache");
  p.sparse_indices = args.sparse_indices.ptr<const int32_t>();
  p.indices_stride = args.sparse_indices.stride(0);
  p.sparse_topk_lens = problem.topk_columns ? nullptr : args.sparse_topk_lens.ptr<const int32_t>();
  if (problem.topk_columns) p.topk = topk_params(args.topk_columns, problem, p.sparse_indices);
  p.seq_lens = args.seq_lens.ptr<const int32_t>();
  p.cum_seq_lens_q =
      args.cum_seq_lens_q.defined() ? args.cum_seq_lens_q.ptr<const int32_t>() : nullptr;
  p.sinks = args.sinks.defined() ? args.sinks.ptr<const float>() : nullptr;
  p.out = args.out.data;
  p.out_token_stride = args.out.stride(0);
  p.out_head_stride = args.out.stride(1);
  p.lse = args.lse.defined() ? args.lse.ptr<float>() : nullptr;
  p.lse_token_stride = args.lse.defined() ? args.lse.stride(0) : 0;
  p.scale_log2 = args.bmm1_scale * kLog2e;
  p.bmm2_scale = args.bmm2_scale;
  p.num_requests = int(problem.num_requests);
  p.num_heads = problem.num_heads;
  p.out_heads = problem.out_heads;
  p.num_columns = int(problem.num_columns);
  p.window = problem.window;
  p.heads_per_cta = plan.heads_per_cta;
  p.head_blocks = plan.head_blocks;
  p.num_splits = plan.num_splits;
  p.tiles_per_split = plan.tiles_per_split;
  p.cluster = plan.cluster;
  const bool counters = plan.num_splits > 1 && !plan.cluster;
  p.partials = counters ? args.workspace.ptr<float>() : nullptr;
  p.counters = counters ? args.kv_counters.ptr<int32_t>() : nullptr;

  const auto s = static_cast<cudaStream_t>(stream);
  switch (problem.layout) {
    case KvLayout::bf16:
      // Measured (docs/kernel.md): the query by TMA helps unsplit plans of 64 heads a CTA
      // (large batches), not split ones (small batches) nor 16 heads a CTA.
      if (QueryTmaParams tp{p}; query_by_tma(plan, q, problem, occupancy, tp))
        return launch<KvLayout::bf16, false, true>(tp, plan.ctas, s);
      return launch<KvLayout::bf16, false>(p, plan.ctas, s);
    case KvLayout::fp8_e4m3:
      if (QueryTmaParams tp{p}; q_fp8 && query_by_tma(plan, q, problem, occupancy, tp))
        return launch<KvLayout::fp8_e4m3, true, true>(tp, plan.ctas, s);
      if (q_fp8) return launch<KvLayout::fp8_e4m3, true>(p, plan.ctas, s);
      return launch<KvLayout::fp8_e4m3, false>(p, plan.ctas, s);
    case KvLayout::fp8_ds_mla:
      // The query by TMA: 128 x 2 H=64 -1.5%, 64 x 2 -2.5%; H=128 -2.0% and H=100 -3.7% since
      // the kernel's seven query-register steps (docs/kernel.md).
      if (QueryTmaParams tp{p}; query_by_tma(plan, q, problem, occupancy, tp))
        return launch<KvLayout::fp8_ds_mla, false, true>(tp, plan.ctas, s);
      return launch<KvLayout::fp8_ds_mla, false>(p, plan.ctas, s);
  }
}

}  // namespace smla::cuda
