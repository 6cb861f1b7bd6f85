// Entry point of the index builders: shape rules, validation, then the backend of the device.
#include "cpu/index.h"

#include "core/check.h"
#include "core/index_problem.h"
#if SMLA_WITH_CUDA
#include "cuda/index.h"
#endif

namespace smla {

int64_t sparse_index_columns(int window, int64_t top_k, int decode_swa_width) {
  if (window < 1) check::fail(ErrorKind::value, "window", ">= 1", std::to_string(window));
  check::int32_count(top_k, "top_k");
  check::int32_count(decode_swa_width, "decode_swa_width");  // a negative one is no "off"
  if (decode_swa_width <= window) return window + (top_k + 3) / 4 * 4;
  // DSpark's wider window: SWA-only layers, their rows written 4 columns at a time.
  if (decode_swa_width % 4 != 0)
    check::fail(ErrorKind::value, "decode_swa_width", "a multiple of 4",
                std::to_string(decode_swa_width));
  if (top_k != 0)
    check::fail(ErrorKind::value, "top_k", "0 (the DSpark window is for SWA-only layers)",
                std::to_string(top_k));
  return decode_swa_width;
}

int64_t sparse_index_columns(const SparseIndexArgs& args) {
  const CompressedColumns& c = args.compressed;
  if (c.compress_ratio < 0)
    check::fail(ErrorKind::value, "compress_ratio", ">= 0", std::to_string(c.compress_ratio));
  const int64_t top_k =
      c.compress_ratio > 0 && c.topk_indices.ndim == 2 ? c.topk_indices.size(1) : 0;
  if (top_k < 0)
    check::fail(ErrorKind::value, "topk_indices", "non-negative sizes",
                check::shape_of(c.topk_indices));
  if (c.compress_ratio > 0 && args.step.decode_swa_width > args.window)
    check::fail(ErrorKind::value, "compress_ratio", "0 (the DSpark window is for SWA-only layers)",
                std::to_string(c.compress_ratio));
  const int64_t K = top_k <= INT32_MAX
                        ? sparse_index_columns(args.window, top_k, args.step.decode_swa_width)
                        : top_k;
  if (K > INT32_MAX)
    check::fail(ErrorKind::value, "topk_indices", "a table width W + top_k < 2^31",
                std::to_string(K) + " columns (W = " + std::to_string(args.window) + ", top_k " +
                    std::to_string(top_k) + ")");
  return K;
}

int dspark_swa_width(int window, int num_draft_tokens) {
  if (window < 1) check::fail(ErrorKind::value, "window", ">= 1", std::to_string(window));
  if (num_draft_tokens < 0)
    check::fail(ErrorKind::value, "num_draft_tokens", ">= 0", std::to_string(num_draft_tokens));
  const int64_t width = (int64_t(window) + num_draft_tokens + 63) / 64 * 64;
  if (width > INT32_MAX)
    check::fail(ErrorKind::value, "num_draft_tokens",
                "window + num_draft_tokens <= 2^31 - 64 (the width is an int)",
                std::to_string(num_draft_tokens));
  return int(width);
}

void build_sparse_indices(const SparseIndexArgs& args, void* stream) {
  const IndexProblem problem = validate_index(args);
  if (problem.device.kind == DeviceKind::cpu) return cpu::build_sparse_indices(problem, args);
#if SMLA_WITH_CUDA
  cuda::build_sparse_indices(problem, args, stream);
#else
  (void)stream;
  check::fail(ErrorKind::unsupported, "sparse_indices",
              "a cpu tensor (this build has no CUDA backend)", device_name(problem.device));
#endif
}

}  // namespace smla
