// The sparse MLA decode op (SPEC §2) and its multi-CTA counters and workspace (SPEC §3).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "smla/tensor.h"

namespace smla {

constexpr int kHeadDim = 512;   // D: 448 NoPE + 64 RoPE; K = V = the whole row
constexpr int kNopeDim = 448;
constexpr int kRopeDim = 64;
constexpr int kMaxHeads = 128;
constexpr int kWindow = 128;    // W in every known config
constexpr int kDsMlaRecordBytes = 576;  // fp8_ds_mla: 448 e4m3 + 64 bf16 per token
constexpr int kDsMlaScaleBytes = 8;     // fp8_ds_mla: 7 UE8M0 scales + 1 pad per token
constexpr int kDsMlaGroup = 64;         // fp8_ds_mla: NoPE values under one UE8M0 scale

// How a KV pool stores its 512-wide rows; fixed by the pool's dtype
// (bf16 -> bf16, f8e4m3 -> fp8_e4m3, u8 -> fp8_ds_mla).
enum class KvLayout { bf16, fp8_e4m3, fp8_ds_mla };
inline constexpr KvLayout kKvLayouts[] = {KvLayout::bf16, KvLayout::fp8_e4m3, KvLayout::fp8_ds_mla};
const char* kv_layout_name(KvLayout layout);

// Compressed columns [W, W + top_k) read straight from an index source's local top-k, exactly as
// build_sparse_indices would have written them (SPEC §4), row lengths included: a compressed
// layer then needs only its SWA group's "swa_only" table, and no table build of its own.
struct TopkColumns {
  TensorView topk_indices;    // [T, top_k] i32 local entries, -1 padded (valid first); or absent
  TensorView block_table;     // [>= B, pages] i32 of compressed_kv_cache (E = its block_size)
  TensorView is_valid_token;  // [T] u8, optional: 0 = padding token, no compressed column
  int64_t num_decodes = 0;    // requests [0, num_decodes) decode, the rest prefill (StepMetadata)
  int compress_ratio = 0;     // >= 1: a prefill token reads its first min((pos+1)/ratio, top_k)
};

// A KV pool is a tensor [num_blocks, block_size, (1,) row] whose last dim is contiguous:
// row = 512 elements (bf16, f8e4m3) or 584 bytes (u8, fp8_ds_mla, whose page interior is
// 576-B records then 8-B scale records and whose page stride is a multiple of 576 B).
// Its block (page) stride may exceed block_size rows (pages packed with other data).
struct DecodeArgs {
  TensorView query;                // [T, H, 512] bf16; f8e4m3 or bf16 with an f8e4m3 cache
  TensorView swa_kv_cache;         // pool read by columns c < window
  TensorView compressed_kv_cache;  // pool read by columns c >= window; absent: swa_kv_cache
  TensorView sparse_indices;       // [T, K] i32 storage offsets, -1 = padding; K or K - W: 4n
  TensorView sparse_topk_lens;     // [T] i32; absent with topk_columns
  TopkColumns topk_columns;        // optional: columns >= W from a top-k (sparse_indices >= W wide)
  TensorView seq_lens;             // [B] i32, KV length including the new tokens
  TensorView cum_seq_lens_q;       // [B+1] i32; absent: one token per request (T == B)
  int max_q_len = 1;               // >= every request's q_len
  TensorView sinks;                // [H] f32, optional; -inf = no sink, +inf = output 0
  float bmm1_scale = NAN;          // score = bmm1_scale * q.k; must be set (D^-0.5 in V4)
  float bmm2_scale = 1.f;          // out = bmm2_scale * softmax . V
  TensorView out;                  // [T, H_out, 512] bf16, H_out >= H; heads >= H get zeros
  TensorView lse;                  // [T, H] f32, optional; natural log, without the sink
  TensorView workspace;            // u8, contiguous, on CUDA 16-byte aligned; smaller than
                                   // workspace_bytes(...) or absent only rules out splits
                                   // reduced through the counters (dtype, contiguity and
                                   // device checked on every device; the CPU reads neither)
  TensorView kv_counters;          // i32/u8, contiguous, on CUDA 4-byte aligned, apart from
                                   // the workspace, zeroed once; kv_counter_bytes(...) covers
                                   // every plan (splits reduced in a cluster need neither)
  int window = kWindow;            // W: columns [0, W) read the SWA pool
};

// Runs the op on the device of its tensors (all on one device; on CUDA it must be the current
// device, cudaSetDevice, else an `unsupported` error). On CUDA it is one kernel launch on
// `stream` (a cudaStream_t of that device; null = legacy default; none for T = 0), capturable
// in a CUDA graph, with programmatic dependent launch (it may start while the previous kernel
// on the stream ends). An Error means nothing was launched (CUDA) or, on the CPU, that out and
// lse are undefined: a bad top-k value in topk_columns is found while rows are written.
// Calls may run concurrently on other threads and streams unless they share kv_counters or
// workspace.
void sparse_mla_decode(const DecodeArgs& args, void* stream = nullptr);

// Bytes of multi-CTA counters for launches of up to `max_tokens` tokens of `num_heads` heads:
// SPEC §3's max_rows = max_tokens x the finest head groups a plan may pick, computed here (0 in
// a build without CUDA). Both functions: sizes past 0..2^31 - 1 or heads below 1 are a value
// error, heads past 128 unsupported.
size_t kv_counter_bytes(int64_t max_tokens, int num_heads);
// Bytes of split-KV workspace enough for every launch of `num_heads` heads with at most
// `max_tokens` tokens and `max_columns` columns on `device` (0 on the CPU). Columns: K, the
// width of sparse_indices; with topk_columns, sparse_index_columns(W, top_k, 0) (top_k rounded
// up to 4, past W).
size_t workspace_bytes(int64_t max_tokens, int num_heads, int64_t max_columns, Device device);

// The widest top-k (TopkColumns' top_k) the op reads on `device`: 2048 on CUDA (the kernel
// stages it in shared memory; whether the device runs the op at all is query_capability's
// answer), INT64_MAX on the CPU (no limit of its own: W + top_k <= 2^31 - 32 holds on every
// device), 0 on CUDA in a build without it. Another device kind is an error (`device`).
int64_t max_topk_width(Device device);

// "supported" or the reason why not, for one configuration on one device.
struct Capability {
  bool supported = false;
  std::string reason;  // empty when supported
};
Capability query_capability(int head_size, DType query_dtype, DType kv_dtype, int block_size,
                            Device device);

// Devices this build can run on and what each supports, as printed by `smla info`.
std::string backend_info();

}  // namespace smla
