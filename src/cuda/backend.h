// The CUDA backend (sm_90a). Only compiled with SMLA_WITH_CUDA; callers guard on it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/problem.h"
#include "cuda/decode_plan.h"

namespace smla::cuda {

// One kernel launch on `stream`; no allocation, no host synchronisation.
void decode(const DecodeProblem& problem, const DecodeArgs& args, void* stream);
// Whether `func` is a decode kernel's host entry (any layout, table or top-k columns), for
// counting graph nodes.
bool is_decode_kernel(const void* func);

size_t kv_counter_bytes(int64_t max_tokens, int num_heads);
// What the decode kernel runs at once on `device`, for the planner (cached per device).
Occupancy decode_occupancy(int device);
// Whether split rows may be reduced in clusters (default true); false leaves the counters only,
// in this process's later plans and workspace sizes: a test seam for the counter path.
void use_cluster_reduction(bool enabled);
size_t workspace_bytes(int64_t max_tokens, int num_heads, int64_t max_columns, int device);

// Empty when `device` can run the kernels, else the reason.
std::string unsupported_reason(int device);
std::string device_info();

}  // namespace smla::cuda
