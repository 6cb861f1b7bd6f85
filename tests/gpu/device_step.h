// A host step (test::StepCase) mirrored on the GPU: every host buffer is copied once, and every
// view of it maps to the same device memory, so one StepCase runs on both backends.
#pragma once
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "device_case.h"
#include "smla/executor.h"
#include "step_case.h"

namespace smla::test {

// Bytes from a view's first element to one past its last (strides may leave gaps).
inline size_t extent_bytes(const TensorView& v) {
  if (!v.defined() || v.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < v.ndim; ++d) last += (v.shape[d] - 1) * v.strides[d];
  return static_cast<size_t>(last + 1) * dtype_size(v.dtype);
}

// The bytes a view spans (host or device), gaps included.
inline std::vector<std::byte> bytes_of(const TensorView& v) {
  std::vector<std::byte> bytes(extent_bytes(v));
  if (bytes.empty()) return bytes;
  if (v.device.kind == DeviceKind::cpu)
    std::memcpy(bytes.data(), v.data, bytes.size());
  else
    CUDA_THROW(cudaMemcpy(bytes.data(), v.data, bytes.size(), cudaMemcpyDeviceToHost));
  return bytes;
}

class DeviceMirror {
 public:
  const Device device = current_gpu();  // where its memory lives

  // The device copy of a host view (made on first use of its buffer).
  TensorView operator()(const TensorView& host) {
    if (!host.defined()) return {};
    const size_t bytes = extent_bytes(host);
    auto [it, fresh] = copies_.try_emplace(host.data);
    if (fresh) {
      const cuda::DeviceScope on(device.id);
      it->second = std::make_unique<DeviceMemory>(bytes);
      CUDA_THROW(cudaMemcpy(it->second->get(), host.data, bytes, cudaMemcpyHostToDevice));
      CUDA_THROW(cudaDeviceSynchronize());  // see output()
    } else if (it->second->bytes() < bytes) {
      throw std::logic_error("two views of one host buffer with different extents");
    }
    TensorView copy = host;
    copy.data = it->second->get();
    copy.device = device;
    return copy;
  }

  StepMetadata operator()(StepMetadata m) {
    m.seq_lens = (*this)(m.seq_lens);
    m.cum_seq_lens_q = (*this)(m.cum_seq_lens_q);
    m.is_valid_token = (*this)(m.is_valid_token);
    return m;
  }

  SparseIndexArgs operator()(SparseIndexArgs a) {
    a.step = (*this)(a.step);
    a.swa = {(*this)(a.swa.block_table), (*this)(a.swa.swa_kv_cache)};
    CompressedColumns& c = a.compressed;
    c.topk_indices = (*this)(c.topk_indices);
    c.block_table = (*this)(c.block_table);
    c.compressed_kv_cache = (*this)(c.compressed_kv_cache);
    return a;
  }

  StepInputs operator()(const StepInputs& host) {
    StepInputs in{.metadata = (*this)(host.metadata)};
    for (const TensorView& t : host.block_tables) in.block_tables.push_back((*this)(t));
    for (const auto& [layer, t] : host.compressed_block_tables)
      in.compressed_block_tables[layer] = (*this)(t);
    for (const auto& [layer, t] : host.topk_indices) in.topk_indices[layer] = (*this)(t);
    return in;
  }

  std::vector<AttentionLayer> operator()(std::vector<AttentionLayer> layers) {
    for (AttentionLayer& l : layers) {
      l.swa_kv_cache = (*this)(l.swa_kv_cache);
      l.compressed_kv_cache = (*this)(l.compressed_kv_cache);
      l.sinks = (*this)(l.sinks);
    }
    return layers;
  }

  // Fresh contiguous device memory of `shape`, every byte `fill` (0xa5: garbage, 0xff: NaN).
  TensorView output(DType dtype, std::initializer_list<int64_t> shape, int fill = 0xa5) {
    const cuda::DeviceScope on(device.id);
    TensorView v = make_view(nullptr, dtype, device, shape);
    outputs_.push_back(std::make_unique<DeviceMemory>(extent_bytes(v)));
    v.data = outputs_.back()->get();
    CUDA_THROW(cudaMemset(v.data, fill, outputs_.back()->bytes()));
    // Done before the tests' non-blocking streams (TestStream) run anything: they do not wait
    // for the legacy stream, where this memset (and a pageable copy's DMA) may still be queued,
    // so it could land over a kernel's output (a flaky GpuIndex failure, forty-fourth session).
    CUDA_THROW(cudaDeviceSynchronize());
    return v;
  }

 private:
  std::map<const void*, std::unique_ptr<DeviceMemory>> copies_;  // by host buffer
  std::vector<std::unique_ptr<DeviceMemory>> outputs_;
};

// A stream for a test's scope: non-blocking, or blocking (synchronized with the legacy stream).
class TestStream {
 public:
  explicit TestStream(bool blocking = false) {
    CUDA_THROW(
        cudaStreamCreateWithFlags(&stream_, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  }
  ~TestStream() { cudaStreamDestroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { CUDA_THROW(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace smla::test
