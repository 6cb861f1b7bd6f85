// A synthetic decode step of a model preset: random caches, block tables, local top-k, queries
// and sinks, on the run's device, with host copies for the oracle.
#pragma once
#include <compare>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "args.h"
#include "core/problem.h"
#include "smla/executor.h"
#include "smla/model.h"
#include "smla/streams.h"

namespace smla::cli {

constexpr int kSwaBlockSize = 64;         // SWA page rows
constexpr int kCompressedBlockSize = 64;  // compressed entries per page (E)

DType kv_dtype(KvLayout layout);        // the pool dtype that means this layout
DType query_dtype(KvLayout layout);     // f8e4m3 with a per-tensor fp8 cache, else bf16

// A (token, head) row of a layer's query and out.
struct Row {
  int64_t token = 0, head = 0;
  auto operator<=>(const Row&) const = default;
};

// Everything a step's layers read and write, as views on one device.
struct StepData {
  std::vector<AttentionLayer> layers{};
  StepInputs inputs;
  std::vector<TensorView> queries, outs;  // per layer: [T, H, 512], out bf16 [T, H, 512]
};

class SynthStep {
 public:
  // Fills every tensor with random data on the host and places it with `streams` (a copy on a
  // device; the host memory itself on the CPU). A step on a device that is not checked
  // (options.check 0) keeps no host copy of its pools, queries and outs, and its pools are made
  // on the device from one random tile of pages repeated: timing needs distinct addresses, not
  // distinct contents, and so the largest steps need neither host memory nor host time for them.
  // Throws smla::Error when the step would need more host memory than the machine should give.
  SynthStep(const RunOptions& options, const std::vector<LayerSpec>& specs, Streams& streams);

  StepData host, device;
  std::vector<int64_t> attended{};  // per layer: columns the step attends (all tokens)
  int64_t num_tokens = 0;
  int64_t max_columns = 0;  // widest table of the step
  int64_t kv_bytes = 0;     // bytes of all pools

  // Copies `rows` of layer `index`'s out from the device into host.outs.
  void download_rows(size_t index, const std::vector<Row>& rows);

  // Zeroes every layer's out on the device: a step run before the one checked (a warm-up) must
  // not leave values there that a row the checked step failed to write would pass with.
  void clear_outs();

 private:
  struct Buffer {
    std::vector<std::byte> host{};
    std::shared_ptr<void> device;
  };
  // Keeps `bytes`; sets its host view and its view on the streams' device (the same on the CPU).
  // Without `host_copy` a device copy drops the host bytes and leaves the host view unset.
  void place(std::vector<std::byte> bytes, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, TensorView& host, TensorView& device,
             bool host_copy = true);
  // Device memory of `bytes` holding `tile` over and over (a pool with no host copy).
  void* tiled(const std::vector<std::byte>& tile, int64_t bytes);

  Streams& streams_;
  std::list<Buffer> buffers_;  // fixed addresses for the views
};

}  // namespace smla::cli
