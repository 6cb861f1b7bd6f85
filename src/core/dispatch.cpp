// Public entry points: validate once, then send the call to the backend of its device.
#include <cstdint>

#include "core/check.h"
#include "core/problem.h"
#include "cpu/backend.h"
#include "smla/error.h"
#if SMLA_WITH_CUDA
#include "cuda/backend.h"
#endif

namespace smla {

void sparse_mla_decode(const DecodeArgs& args, void* stream) {
  const DecodeProblem problem = validate_decode(args);
  if (problem.device.kind == DeviceKind::cpu) return cpu::decode(problem, args);
#if SMLA_WITH_CUDA
  return cuda::decode(problem, args, stream);
#else
  (void)stream;
  throw Error(ErrorKind::unsupported, "query", "a cpu tensor (this build has no CUDA backend)",
              device_name(problem.device));
#endif
}

// The buffer sizes' arguments: what a launch may have (decode validation's 32-bit limits).
static void check_sizes(int64_t max_tokens, int num_heads, int64_t max_columns = 0) {
  check::int32_count(max_tokens, "max_tokens");
  if (num_heads < 1 || num_heads > kMaxHeads)  // more heads: a limit of the kernels, as in decode
    check::fail(num_heads < 1 ? ErrorKind::value : ErrorKind::unsupported, "num_heads",
                "1.." + std::to_string(kMaxHeads), std::to_string(num_heads));
  check::int32_count(max_columns, "max_columns");
}

size_t kv_counter_bytes(int64_t max_tokens, int num_heads) {
  check_sizes(max_tokens, num_heads);
#if SMLA_WITH_CUDA
  return cuda::kv_counter_bytes(max_tokens, num_heads);
#else
  (void)max_tokens, (void)num_heads;
  return 0;
#endif
}

size_t workspace_bytes(int64_t max_tokens, int num_heads, int64_t max_columns, Device device) {
  check_sizes(max_tokens, num_heads, max_columns);
  check::device(device, "device");
  if (device.kind == DeviceKind::cpu) return 0;
#if SMLA_WITH_CUDA
  return cuda::workspace_bytes(max_tokens, num_heads, max_columns, device.id);
#else
  (void)max_tokens, (void)num_heads, (void)max_columns;
  return 0;
#endif
}

int64_t max_topk_width(Device device) {
  check::device(device, "device");
  if (device.kind == DeviceKind::cpu) return INT64_MAX;
#if SMLA_WITH_CUDA
  return cuda::kMaxTopk;
#else
  return 0;
#endif
}

const char* kv_layout_name(KvLayout layout) {
  switch (layout) {
    case KvLayout::bf16:
      return "bf16";
    case KvLayout::fp8_e4m3:
      return "fp8_e4m3";
    case KvLayout::fp8_ds_mla:
      return "fp8_ds_mla";
  }
  return "?";
}

static Capability refuse(std::string reason) { return {false, std::move(reason)}; }

Capability query_capability(int head_size, DType query_dtype, DType kv_dtype, int block_size,
                            Device device) {
  if (head_size != kHeadDim)
    return refuse("head size must be 512 (448 NoPE + 64 RoPE), got " + std::to_string(head_size));
  if (block_size <= 0)
    return refuse("block size must be positive, got " + std::to_string(block_size));
  if (kv_dtype != DType::bf16 && kv_dtype != DType::f8e4m3 && kv_dtype != DType::u8)
    return refuse(std::string("KV cache dtype must be bf16, f8e4m3 or u8 (fp8_ds_mla), got ") +
                  dtype_name(kv_dtype));
  const bool query_ok =
      query_dtype == DType::bf16 || (query_dtype == DType::f8e4m3 && kv_dtype == DType::f8e4m3);
  if (!query_ok)
    return refuse(std::string("query dtype ") + dtype_name(query_dtype) + " does not go with a " +
                  dtype_name(kv_dtype) + " cache (bf16 query, or f8e4m3 with an f8e4m3 cache)");
  if (device.kind == DeviceKind::cpu) return {true, {}};
  if (device.kind != DeviceKind::cuda)
    return refuse("device " + device_name(device) + " is neither cpu nor cuda");
#if SMLA_WITH_CUDA
  if (std::string why = cuda::unsupported_reason(device.id); !why.empty()) return refuse(why);
  // The kernel addresses a page's scales by a 32-bit offset past its records.
  if (kv_dtype == DType::u8 && int64_t{block_size} * kDsMlaRecordBytes > UINT32_MAX)
    return refuse("fp8_ds_mla pages of at most 2^32 bytes of records on CUDA: block size at most " +
                  std::to_string(UINT32_MAX / kDsMlaRecordBytes) + ", got " +
                  std::to_string(block_size));
  return {true, {}};
#else
  return refuse("this build has no CUDA backend");
#endif
}

std::string backend_info() {
  std::string info = "cpu: supported (bf16, fp8_e4m3, fp8_ds_mla caches; 1..128 heads)\n";
#if SMLA_WITH_CUDA
  info += cuda::device_info();
#else
  info += "cuda: not built\n";
#endif
  return info;
}

}  // namespace smla
