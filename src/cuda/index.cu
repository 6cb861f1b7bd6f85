// The CUDA index builder: one CTA per token row, its threads over the row's columns. Device
// data is never trusted to be in range: every read and write stays inside its tensor whatever
// the values (SPEC §2: a bad top-k must not crash the GPU).
#include "cuda/index.h"

#include <cuda_runtime.h>

#include <string>

#include "core/index_rules.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/device.h"

namespace smla::cuda {
namespace {

constexpr int kThreads = 128;  // columns of a row written at once

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

// A block table and the pool geometry its slots address.
struct PageTable {
  I32View table;
  int64_t block_size, span;
  // The storage offset of position (or entry) pos >= 0 of request b; -1 past the table's
  // pages, where the CPU throws.
  __device__ int32_t offset(int64_t b, int64_t pos) const {
    const int64_t page = pos / block_size;
    if (page >= table.cols) return -1;
    return rules::storage_offset(rules::slot(table.at(b, page), block_size, pos), block_size, span);
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

__global__ void __launch_bounds__(kThreads) build_index_kernel(const IndexParams p) {
  const int64_t t = blockIdx.x;
  auto start = [&](int64_t b) -> int64_t { return p.cum.data ? p.cum.at(b) : b; };
  const int64_t b = rules::request_of(t, p.num_requests, start);
  const int64_t seq_len = p.seq_lens.at(b), q_len = start(b + 1) - start(b);
  const bool valid = !p.is_valid || p.is_valid[t * p.valid_stride];
  const bool decode = b < p.num_decodes;
  const rules::Window w = rules::swa_window(seq_len, q_len, t - start(b), p.window, p.dspark);
  const int64_t used =
      p.compress_ratio > 0 ? rules::topk_used(decode, w.end - 1, p.compress_ratio, p.top_k) : 0;
  const int64_t swa_columns = p.dspark ? p.num_columns : p.window;

  int64_t count = 0;  // a decode token's valid top-k entries
  // Every thread runs every round: __syncthreads_count needs the whole CTA.
  for (int64_t base = 0; base < p.num_columns; base += kThreads) {
    const int64_t c = base + threadIdx.x;
    int32_t value = -1;
    bool counted = false;
    if (valid && c < swa_columns) {
      if (w.start + c < w.end) value = p.swa.offset(b, w.start + c);
    } else if (valid && c < p.num_columns && c - p.window < used) {
      const int32_t x = p.topk.at(t, c - p.window);
      value = x < 0 ? x : p.compressed.offset(b, x);
      counted = x >= 0;
    }
    if (c < p.num_columns) p.indices[t * p.indices_stride0 + c * p.indices_stride1] = value;
    count += __syncthreads_count(counted);
  }

  if (threadIdx.x != 0) return;
  int64_t len = p.window;  // a padding token's: W + 0
  if (valid && p.dspark) {
    // At most K on valid steps (q_len <= K - W); a bad seq_len must not claim more columns.
    len = w.end - w.start > p.window ? w.end - w.start : p.window;
    len = len < p.num_columns ? len : p.num_columns;
  } else if (valid && p.compress_ratio > 0) {
    len = p.window + (decode ? count : used);
  }
  p.lens[t * p.lens_stride] = static_cast<int32_t>(len);
  if (p.dspark) p.out_seq_lens[t * p.out_seq_lens_stride] = static_cast<int32_t>(seq_len);
}

}  // namespace

const void* index_kernel() { return reinterpret_cast<const void*>(&build_index_kernel); }

void build_sparse_indices(const IndexProblem& problem, const SparseIndexArgs& a, void* stream) {
  const int device = problem.device.id;
  if (const std::string why = unsupported_reason(device); !why.empty())
    throw Error(ErrorKind::unsupported, "sparse_indices", "a tensor on a Hopper GPU", why);
  if (current_device() != device)
    throw Error(
        ErrorKind::unsupported, "sparse_indices",
        "tensors on the current CUDA device (cuda:" + std::to_string(current_device()) + ")",
        device_name(problem.device));
  if (problem.num_tokens == 0) return;
  // Shapes alone say so; the CPU finds it reading cum_seq_lens_q.
  if (problem.num_requests == 0)
    throw Error(ErrorKind::value, "cum_seq_lens_q",
                "a request for the " + std::to_string(problem.num_tokens) + " tokens", "B = 0");
  if (problem.num_tokens > INT32_MAX)
    throw Error(ErrorKind::unsupported, "num_tokens", "at most 2^31 - 1 rows on CUDA",
                std::to_string(problem.num_tokens));

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
  build_index_kernel<<<static_cast<unsigned>(problem.num_tokens), kThreads, 0,
                       static_cast<cudaStream_t>(stream)>>>(p);
  SMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace smla::cuda
