// A DecodeCase copied to the GPU: every tensor in device memory, plus the split-KV workspace
// and counters that the public API sizes, so tests run the same call on both backends.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/device.h"
#include "host_case.h"
#include "smla/decode.h"

namespace smla::test {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call
#define CUDA_OK(call) EXPECT_EQ((call), cudaSuccess) << #call

// Throws (a test failure with the call named) when a CUDA call fails: for constructors and
// helpers that cannot return a gtest failure.
inline void cuda_ok(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}
#define CUDA_THROW(call) ::smla::test::cuda_ok((call), #call)

inline int gpu_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  return status == cudaSuccess ? count : 0;
}

// SMLA_REQUIRE_GPU=1 (scripts/gpu_check.sh sets it) turns "no GPU" into a failure: a GPU
// machine whose device the process cannot see must not pass by skipping every test.
inline bool gpu_required() {
  const char* v = std::getenv("SMLA_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

#define SKIP_WITHOUT_GPU()                                                            \
  if (gpu_count() == 0) {                                                             \
    if (gpu_required()) FAIL() << "SMLA_REQUIRE_GPU=1 and no CUDA device is visible"; \
    GTEST_SKIP() << "no CUDA device: GPU tests skipped";                              \
  }

#define SKIP_WITHOUT_TWO_GPUS() \
  if (gpu_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices: multi-device test skipped"

// The current CUDA device, where test helpers put their memory.
inline Device current_gpu() {
  int id = 0;
  CUDA_THROW(cudaGetDevice(&id));
  return {DeviceKind::cuda, id};
}

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    CUDA_THROW(cudaMalloc(&ptr_, bytes ? bytes : 16));
  }
  ~DeviceMemory() { cudaFree(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Split rows go through the counters alone while in scope (the planner's clusters off).
struct CountersOnly {
  CountersOnly() { cuda::use_cluster_reduction(false); }
  ~CountersOnly() { cuda::use_cluster_reduction(true); }
  CountersOnly(const CountersOnly&) = delete;
  CountersOnly& operator=(const CountersOnly&) = delete;
};

// On the device current at construction.
struct DeviceCase {
  const Device device = current_gpu();
  std::map<const HostTensor*, std::unique_ptr<DeviceMemory>> tensors;
  // The split buffers, each allocated with kGuardBytes of kGuard past the view the launch gets
  // (workspace_size, counter_size bytes), which it must leave as they are (guards_intact).
  static constexpr size_t kGuardBytes = 4096;
  static constexpr uint8_t kGuard = 0x5a;
  std::unique_ptr<DeviceMemory> workspace, counters;
  size_t workspace_size = 0, counter_size = 0;
  DecodeArgs args;

  // `counter_bytes` / `workspace_bytes` below the API's sizes exercise the fallback.
  explicit DeviceCase(DecodeCase& c, size_t counter_bytes = SIZE_MAX, size_t ws_bytes = SIZE_MAX) {
    c.for_each_tensor([&](const char*, HostTensor& t) {
      auto memory = std::make_unique<DeviceMemory>(t.bytes.size());
      CUDA_THROW(cudaMemcpy(memory->get(), t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
      tensors[&t] = std::move(memory);
    });
    args = c.args(device, [&](const HostTensor& t) { return tensors.at(&t)->get(); });
    const int64_t T = c.query.size(0), K = c.sparse_indices.size(1);
    const int H = static_cast<int>(c.query.size(1));
    counter_bytes = std::min(counter_bytes, kv_counter_bytes(T, H));
    // No workspace asks nothing of the device: a test may decode first with the process's
    // occupancy not yet queried.
    if (ws_bytes) ws_bytes = std::min(ws_bytes, workspace_bytes(T, H, K, device));
    counter_size = counter_bytes, workspace_size = ws_bytes;
    counters = std::make_unique<DeviceMemory>(counter_bytes + kGuardBytes);
    workspace = std::make_unique<DeviceMemory>(ws_bytes + kGuardBytes);
    CUDA_THROW(cudaMemset(counters->get(), 0, counter_bytes));
    // The workspace needs no initial value: NaN in it shows a split that never stored its
    // partial (zeros would merge as a no-op).
    CUDA_THROW(cudaMemset(workspace->get(), 0xff, ws_bytes));
    CUDA_THROW(cudaMemset(guard(counters, counter_size), kGuard, kGuardBytes));
    CUDA_THROW(cudaMemset(guard(workspace, workspace_size), kGuard, kGuardBytes));
    if (counter_bytes)
      args.kv_counters = make_view(counters->get(), DType::u8, device, {int64_t(counter_bytes)});
    if (ws_bytes)
      args.workspace = make_view(workspace->get(), DType::u8, device, {int64_t(ws_bytes)});
    // The copies and the memset went on the legacy stream, which a test's non-blocking stream
    // does not wait for.
    CUDA_THROW(cudaDeviceSynchronize());
  }

  void* device_ptr(const HostTensor& t) const { return tensors.at(&t)->get(); }

  // NaN in the case's outputs (out, and lse where it has one) on `stream`: an element a launch
  // leaves unwritten then fails every comparison.
  void poison_outputs(const DecodeCase& c, cudaStream_t stream = nullptr) const {
    CUDA_THROW(cudaMemsetAsync(device_ptr(c.out), 0xff, c.out.bytes.size(), stream));
    if (c.lse.defined())
      CUDA_THROW(cudaMemsetAsync(device_ptr(c.lse), 0xff, c.lse.bytes.size(), stream));
  }

  // The plan sparse_mla_decode(args) makes now, from the launch's inputs: the shape, the cache
  // layout (swa_kv_cache's dtype), the occupancy (clusters off under CountersOnly) and the
  // workspace and counter bytes given, which cap the counter-reduced splits.
  cuda::DecodePlan plan() const {
    const auto bytes = [](const TensorView& v) {
      return v.defined() ? static_cast<size_t>(v.numel()) * dtype_size(v.dtype) : size_t{0};
    };
    const DType kv = args.swa_kv_cache.dtype;
    const KvLayout layout = kv == DType::u8       ? KvLayout::fp8_ds_mla
                            : kv == DType::f8e4m3 ? KvLayout::fp8_e4m3
                                                  : KvLayout::bf16;
    return cuda::plan_decode(
        args.query.size(0), static_cast<int>(args.query.size(1)), args.sparse_indices.size(1),
        layout, cuda::decode_occupancy(device.id), bytes(args.workspace), bytes(args.kv_counters));
  }

  // Copies the outputs back into the case (so the oracle comparison reads them).
  void fetch(DecodeCase& c) const {
    CUDA_THROW(cudaMemcpy(c.out.bytes.data(), device_ptr(c.out), c.out.bytes.size(),
                          cudaMemcpyDeviceToHost));
    if (c.lse.defined())
      CUDA_THROW(cudaMemcpy(c.lse.bytes.data(), device_ptr(c.lse), c.lse.bytes.size(),
                            cudaMemcpyDeviceToHost));
  }

  // Whether the launch stored split partials (the workspace starts as 0xff bytes): what the
  // counter-reduced plans alone do.
  bool workspace_written() const {
    std::vector<uint8_t> bytes(workspace_size);
    CUDA_THROW(cudaMemcpy(bytes.data(), workspace->get(), bytes.size(), cudaMemcpyDeviceToHost));
    return std::any_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b != 0xff; });
  }

  std::vector<int32_t> counter_values() const {
    std::vector<int32_t> v(counter_size / 4);
    CUDA_THROW(cudaMemcpy(v.data(), counters->get(), v.size() * 4, cudaMemcpyDeviceToHost));
    return v;
  }

  // Whether the bytes past the workspace and counter views still hold kGuard.
  bool guards_intact() const {
    std::vector<uint8_t> bytes(kGuardBytes);
    for (const auto& [memory, size] :
         {std::pair{counters.get(), counter_size}, std::pair{workspace.get(), workspace_size}}) {
      CUDA_THROW(cudaMemcpy(bytes.data(), static_cast<char*>(memory->get()) + size, kGuardBytes,
                            cudaMemcpyDeviceToHost));
      if (std::any_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b != kGuard; }))
        return false;
    }
    return true;
  }

 private:
  static void* guard(const std::unique_ptr<DeviceMemory>& memory, size_t size) {
    return static_cast<char*>(memory->get()) + size;
  }
};

// The grid and cluster size of the one kernel sparse_mla_decode(args) launches, as a graph
// capture of the call records them (capturing runs nothing); `nodes` counts the capture's nodes
// of any kind (SPEC §3: one kernel, no memset).
struct CapturedLaunch {
  size_t nodes = 0;
  int64_t ctas = 0;
  int64_t cluster = 1;  // CTAs a cluster (1: no clusters)
};

inline CapturedLaunch captured_launch(const DecodeArgs& args) {
  struct Capture {  // freed on every path
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    ~Capture() {
      if (stream) {
        cudaStreamCaptureStatus status{};
        if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
            status != cudaStreamCaptureStatusNone) {  // a call that threw: no stale error
          (void)cudaStreamEndCapture(stream, &graph);
          (void)cudaGetLastError();
        }
        (void)cudaStreamDestroy(stream);
      }
      if (graph) (void)cudaGraphDestroy(graph);
    }
  } c;
  CUDA_THROW(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  CUDA_THROW(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  sparse_mla_decode(args, c.stream);
  CUDA_THROW(cudaStreamEndCapture(c.stream, &c.graph));
  cudaGraph_t graph = c.graph;
  CapturedLaunch launch;
  CUDA_THROW(cudaGraphGetNodes(graph, nullptr, &launch.nodes));
  std::vector<cudaGraphNode_t> nodes(launch.nodes);
  CUDA_THROW(cudaGraphGetNodes(graph, nodes.data(), &launch.nodes));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    CUDA_THROW(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params{};
    CUDA_THROW(cudaGraphKernelNodeGetParams(node, &params));
    if (!cuda::is_decode_kernel(params.func)) continue;
    launch.ctas = int64_t(params.gridDim.x) * params.gridDim.y * params.gridDim.z;
    cudaLaunchAttributeValue value{};
    const cudaError_t e =
        cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &value);
    if (e != cudaSuccess) {  // the outputs are still checked
      (void)cudaGetLastError();
      ADD_FAILURE() << "the decode node's cluster size: " << cudaGetErrorString(e);
    }
    const int64_t cluster = int64_t(value.clusterDim.x) * value.clusterDim.y * value.clusterDim.z;
    launch.cluster = cluster > 0 ? cluster : 1;  // 0: launched without the attribute
  }
  return launch;
}

inline bool all_zero(const std::vector<int32_t>& v) {
  for (int32_t x : v)
    if (x != 0) return false;
  return true;
}

}  // namespace smla::test
