#include "cuda/streams.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/block_cache.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/device.h"

namespace smla::cuda {
namespace {

struct StreamDestroy {
  void operator()(cudaStream_t s) const { ignore_failure(cudaStreamDestroy(s)); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { ignore_failure(cudaEventDestroy(e)); }
};
using OwnedStream = std::unique_ptr<CUstream_st, StreamDestroy>;
using OwnedEvent = std::unique_ptr<CUevent_st, EventDestroy>;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  // The legacy stream, asked while another stream of its device captures: the question itself
  // would join that capture, so the answer is yes.
  if (e == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();
    return true;
  }
  check(e, "cudaStreamIsCapturing(stream, &status)");
  return status != cudaStreamCaptureStatusNone;
}

OwnedEvent new_event() {
  cudaEvent_t event = nullptr;
  SMLA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return OwnedEvent(event);
}

class CudaStreams final : public Streams {
 public:
  CudaStreams(Device device, cudaStream_t stream) : device_(device), current_(stream) {
    const DeviceScope scope(device.id);
    require(!capturing(current_), "stream",
            "a stream that is not capturing (make the executor or tables before a CUDA-graph "
            "capture begins)",
            "a capturing stream");
    require_stream_of(current_, device.id);
    cudaStream_t side = nullptr;
    SMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    side_.reset(side);
    fork_ = new_event();
    join_ = new_event();
    cache_ = BlockCache::create({.allocate =
                                     [id = device.id](size_t bytes) {
                                       const DeviceScope scope(id);
                                       void* block = nullptr;
                                       SMLA_CUDA_CHECK(cudaMalloc(&block, bytes));
                                       return block;
                                     },
                                 // Must not throw (the cache's destructor calls it, maybe
                                 // at exit): unchecked calls, a failure leaks the block.
                                 .release =
                                     [id = device.id](void* block) noexcept {
                                       int previous = id;
                                       ignore_failure(cudaGetDevice(&previous));
                                       if (previous != id) ignore_failure(cudaSetDevice(id));
                                       ignore_failure(cudaFree(block));
                                       if (previous != id) ignore_failure(cudaSetDevice(previous));
                                     },
                                 .capturing =
                                     [current = current_, id = device.id] {
                                       const DeviceScope scope(id);
                                       return capturing(current);
                                     }});
  }

  Device device() const override { return device_; }
  void* current() const override { return current_; }
  void* side() const override { return side_.get(); }

  void reserve_events(int count) override {
    const DeviceScope scope(device_.id);
    while (static_cast<int>(events_.size()) < count) events_.push_back(new_event());
  }

  // Each stream operation runs with the streams' device current: a null `current_` is the
  // legacy default stream of whichever device is current.
  void fork() override {
    const DeviceScope scope(device_.id);
    SMLA_CUDA_CHECK(cudaEventRecord(fork_.get(), current_));
    SMLA_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), fork_.get(), 0));
  }
  void record(int event) override {
    const DeviceScope scope(device_.id);
    SMLA_CUDA_CHECK(cudaEventRecord(slot(event), side_.get()));
  }
  void wait(int event) override {
    const DeviceScope scope(device_.id);
    SMLA_CUDA_CHECK(cudaStreamWaitEvent(current_, slot(event), 0));
  }
  void join() override {
    const DeviceScope scope(device_.id);
    SMLA_CUDA_CHECK(cudaEventRecord(join_.get(), side_.get()));
    SMLA_CUDA_CHECK(cudaStreamWaitEvent(current_, join_.get(), 0));
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return cache_->allocate(bytes); }
  std::shared_ptr<void> allocate_persistent(size_t bytes) override {
    return cache_->allocate(bytes, true);
  }
  void zero(void* dst, size_t bytes) override {
    const DeviceScope scope(device_.id);
    refuse_capture("zero", "a memset node would rerun on every replay");
    SMLA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_));
  }
  void upload(void* dst, const void* host_src, size_t bytes) override {
    const DeviceScope scope(device_.id);
    refuse_capture("upload", kWaits);
    SMLA_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, current_));
    synchronize();
  }
  void download(void* host_dst, const void* src, size_t bytes) override {
    const DeviceScope scope(device_.id);
    refuse_capture("download", kWaits);
    SMLA_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, current_));
    synchronize();
  }
  void synchronize() override {
    const DeviceScope scope(device_.id);
    refuse_capture("synchronize", kWaits);
    SMLA_CUDA_CHECK(cudaStreamSynchronize(current_));
  }

 private:
  static constexpr const char* kWaits = "it waits for the stream, which would end the capture";

  // Refused before any CUDA call, so that the caller's capture stays valid.
  void refuse_capture(const char* operation, const char* why) const {
    if (capturing(current_))
      throw Error(ErrorKind::unsupported, operation,
                  std::string("no CUDA-graph capture on the stream (") + why + ")",
                  "a capturing stream");
  }

  cudaEvent_t slot(int event) const {
    if (event < 0 || event >= static_cast<int>(events_.size()))
      throw Error(ErrorKind::value, "event",
                  "a slot below reserve_events' " + std::to_string(events_.size()),
                  std::to_string(event));
    return events_[event].get();
  }

  Device device_;
  cudaStream_t current_;
  OwnedStream side_;
  OwnedEvent fork_, join_;             // fork: the current stream's mark; join: the side's
  std::vector<OwnedEvent> events_;     // the slots
  std::shared_ptr<BlockCache> cache_;  // outlives this object while a block is held
};

}  // namespace

std::unique_ptr<Streams> make_streams(Device device, void* stream) {
  require_supported(device.id);
  return std::make_unique<CudaStreams>(device, static_cast<cudaStream_t>(stream));
}

}  // namespace smla::cuda
