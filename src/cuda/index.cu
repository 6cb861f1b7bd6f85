// The CUDA index builder: one CTA per token row, its threads over the row's columns. A row is
// a chain of dependent loads (request, its lengths, block-table pages), so each link is issued
// for every column at once and the CTA meets at a barrier at most twice. Device data is never
// trusted to be in range: every read and write stays inside its tensor whatever the values
// (SPEC §2: a bad top-k must not crash the GPU).
#include "cuda/index.h"

#include <cuda_runtime.h>

#include <string>

#include "core/index_rules.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace smla::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Columns a thread owns per pass, c = base + threadIdx.x + k * kThreads (k < kSlots): a pass
// is 1536 columns, so V4's rows (W + 512, W + 1024) take one.
constexpr int kSlots = 3;
constexpr int64_t kPassColumns = int64_t{kThreads} * kSlots;

// A strided i32 vector or matrix.
struct I32View {
  const int32_t* data;
  int64_t stride0, stride1, cols;
  __device__ int32_t at(int64_t i, int64_t j = 0) const { return data[i * stride0 + j * stride1]; }
};

I32View i32_view(const TensorView& v) {
  if (!v.defined()) return {};
  return {v.ptr<const int32_t>(), v.strides[0], v.ndim > 1 ? v.strides[1] : 0,
          v.ndim > 1 ? v.shape[1] : 1};
}

// A block table and the pool geometry its slots address. Reading a page and using it are
// separate steps, so that a thread can read all its columns' pages before it waits on one.
struct PageTable {
  I32View table;
  int64_t block_size, span;
  // Request b's page id for position (or entry) pos >= 0 into `id`; false past the table's
  // pages, where the CPU throws (the column becomes -1).
  __device__ bool page(int64_t b, int64_t pos, int32_t& id) const {
    const int64_t page = pos / block_size;
    if (page >= table.cols) return false;
    id = table.at(b, page);
    return true;
  }
  // The storage offset of position pos on page `id`.
  __device__ int32_t offset(int32_t id, int64_t pos) const {
    return rules::storage_offset(rules::slot(id, block_size, pos), block_size, span);
  }
};

struct IndexParams {
  I32View seq_lens, cum;    // cum.data null: one token per request
  const uint8_t* is_valid;  // null: every token valid
  int64_t valid_stride;
  int64_t num_requests, num_decodes, num_columns, top_k;
  int window, compress_ratio;
  bool dspark;
  PageTable swa, compressed;
  I32View topk;
  int32_t* indices;
  int64_t indices_stride0, indices_stride1;
  int32_t* lens;
  int64_t lens_stride;
  int32_t* out_seq_lens;  // DSpark only
  int64_t out_seq_lens_stride;
};

// The sum of every thread's v, for every thread. Each call site passes its own `partial`, so
// two sums in a row need no barrier between them.
__device__ int block_sum(int v, int (&partial)[kWarps]) {
  v = __reduce_add_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  int sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += partial[w];
  return sum;
}

// What a row's columns need once its request is known.
struct Row {
  int64_t t, b;
  bool valid;
  rules::Window w;
  int64_t swa_columns;  // columns [0, swa_columns) hold SWA positions
  int64_t used;         // top-k entries the row reads
};

// The top-k values of the pass at `base` (-1 where a column has none). They depend on the
// token alone, so they are read before whatever decides whether they are used.
__device__ void load_topk(const IndexParams& p, int64_t t, int64_t base, int32_t (&x)[kSlots]) {
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t j = base + threadIdx.x + k * kThreads - p.window;
    x[k] = p.compress_ratio > 0 && j >= 0 && j < p.top_k ? p.topk.at(t, j) : -1;
  }
}

// Writes the pass at `base` of row r, given its top-k values x; returns how many of its top-k
// entries are >= 0. Every page is read before any column is written: one load latency a pass.
__device__ int write_pass(const IndexParams& p, const Row& r, int64_t base,
                          const int32_t (&x)[kSlots]) {
  int32_t value[kSlots], id[kSlots];
  int64_t pos[kSlots];  // the SWA position or compressed entry that page id[k] holds
  bool paged[kSlots];   // value[k] is still to be made from id[k] and pos[k]
  int counted = 0;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t c = base + threadIdx.x + k * kThreads;
    value[k] = -1;
    paged[k] = false;
    if (!r.valid || c >= p.num_columns) continue;
    if (c < r.swa_columns) {
      pos[k] = r.w.start + c;
      paged[k] = pos[k] < r.w.end && p.swa.page(r.b, pos[k], id[k]);
    } else if (c - p.window < r.used) {
      pos[k] = x[k];
      value[k] = x[k] < 0 ? x[k] : -1;  // a negative entry is copied
      paged[k] = x[k] >= 0 && p.compressed.page(r.b, x[k], id[k]);
      counted += x[k] >= 0;
    }
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t c = base + threadIdx.x + k * kThreads;
    if (paged[k])
      value[k] =
          c < r.swa_columns ? p.swa.offset(id[k], pos[k]) : p.compressed.offset(id[k], pos[k]);
    if (c < p.num_columns) p.indices[r.t * p.indices_stride0 + c * p.indices_stride1] = value[k];
  }
  return counted;
}

__global__ void __launch_bounds__(kThreads) build_index_kernel(const IndexParams p) {
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();  // the step's inputs, and this table's buffer, may be in use until now
  __shared__ int partial[2][kWarps];  // one per block_sum
  Row r{};
  r.t = blockIdx.x;
  // What depends on the token alone is in flight while its request is found.
  r.valid = !p.is_valid || p.is_valid[r.t * p.valid_stride];
  int32_t x[kSlots];
  load_topk(p, r.t, 0, x);

  // Without cum_seq_lens_q a token is its own request; with it, the CTA counts the requests
  // started by t (one load a thread for B <= 512, where a binary search waits on log2(B)).
  auto start = [&](int64_t b) -> int64_t { return p.cum.data ? p.cum.at(b) : b; };
  r.b = r.t;
  if (p.cum.data) {
    const int64_t started =
        rules::requests_started(r.t, 1 + threadIdx.x, kThreads, p.num_requests, start);
    r.b = block_sum(static_cast<int>(started), partial[0]);
  }
  const int64_t seq_len = p.seq_lens.at(r.b), first = start(r.b);
  const bool decode = r.b < p.num_decodes;
  r.w = rules::swa_window(seq_len, start(r.b + 1) - first, r.t - first, p.window, p.dspark);
  r.swa_columns = p.dspark ? p.num_columns : p.window;
  r.used =
      p.compress_ratio > 0 ? rules::topk_used(decode, r.w.end - 1, p.compress_ratio, p.top_k) : 0;

  int count = 0;  // this thread's valid top-k entries
  for (int64_t base = 0; base < p.num_columns; base += kPassColumns) {
    if (base > 0) load_topk(p, r.t, base, x);
    count += write_pass(p, r, base, x);
  }
  // Only a valid decode row of a compressed layer counts its entries; the test is the same in
  // every thread of the CTA, so the barrier inside is met by all or none.
  const bool counts = r.valid && decode && p.compress_ratio > 0;
  if (counts) count = block_sum(count, partial[1]);

  if (threadIdx.x != 0) return;
  int64_t len = p.window;  // a padding token's: W + 0
  if (r.valid && p.dspark) {
    // At most K on valid steps (q_len <= K - W); a bad seq_len must not claim more columns.
    len = r.w.end - r.w.start > p.window ? r.w.end - r.w.start : p.window;
    len = len < p.num_columns ? len : p.num_columns;
  } else if (r.valid && p.compress_ratio > 0) {
    len = p.window + (decode ? count : r.used);
  }
  p.lens[r.t * p.lens_stride] = static_cast<int32_t>(len);
  if (p.dspark) p.out_seq_lens[r.t * p.out_seq_lens_stride] = static_cast<int32_t>(seq_len);
}

}  // namespace

const void* index_kernel() { return reinterpret_cast<const void*>(&build_index_kernel); }

void build_sparse_indices(const IndexProblem& problem, const SparseIndexArgs& a, void* stream) {
  require_usable(problem.device, "sparse_indices");
  if (problem.num_tokens == 0) return;
  if (problem.num_tokens > INT32_MAX)
    throw Error(ErrorKind::unsupported, "num_tokens", "at most 2^31 - 1 rows on CUDA",
                std::to_string(problem.num_tokens));
  // The kernel counts a token's request in int.
  if (problem.num_requests > INT32_MAX)
    throw Error(ErrorKind::unsupported, "seq_lens", "at most 2^31 - 1 requests on CUDA",
                std::to_string(problem.num_requests));

  const StepMetadata& s = a.step;
  IndexParams p{};
  p.seq_lens = i32_view(s.seq_lens);
  p.cum = i32_view(s.cum_seq_lens_q);
  p.is_valid = s.is_valid_token.defined() ? s.is_valid_token.ptr<const uint8_t>() : nullptr;
  p.valid_stride = s.is_valid_token.defined() ? s.is_valid_token.strides[0] : 0;
  p.num_requests = problem.num_requests;
  p.num_decodes = problem.num_decodes;
  p.num_columns = problem.num_columns;
  p.top_k = problem.top_k;
  p.window = problem.window;
  p.compress_ratio = problem.compress_ratio;
  p.dspark = problem.dspark;
  p.swa = {i32_view(a.swa.block_table), problem.swa.block_size, problem.swa.span};
  if (problem.compress_ratio > 0) {
    p.compressed = {i32_view(a.compressed.block_table), problem.compressed.block_size,
                    problem.compressed.span};
    p.topk = i32_view(a.compressed.topk_indices);
  }
  const SparseIndexTable& out = a.out;
  p.indices = out.sparse_indices.ptr<int32_t>();
  p.indices_stride0 = out.sparse_indices.strides[0];
  p.indices_stride1 = out.sparse_indices.strides[1];
  p.lens = out.sparse_topk_lens.ptr<int32_t>();
  p.lens_stride = out.sparse_topk_lens.strides[0];
  if (problem.dspark) {
    p.out_seq_lens = out.seq_lens.ptr<int32_t>();
    p.out_seq_lens_stride = out.seq_lens.strides[0];
  }
  launch_early("the index kernel", build_index_kernel,
               dim3(static_cast<unsigned>(problem.num_tokens)), dim3(kThreads), 0,
               static_cast<cudaStream_t>(stream), 1, p);
}

}  // namespace smla::cuda
