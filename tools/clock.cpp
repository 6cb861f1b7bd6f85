#include "clock.h"

#include <chrono>

#if SMLA_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#endif

namespace smla::cli {
namespace {

class HostClock final : public StepClock {
 public:
  void mark() override { marks_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> intervals() override {
    std::vector<double> seconds;
    for (size_t i = 1; i < marks_.size(); ++i)
      seconds.push_back(std::chrono::duration<double>(marks_[i] - marks_[i - 1]).count());
    return seconds;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

#if SMLA_WITH_CUDA
class EventClock final : public StepClock {
 public:
  explicit EventClock(Streams& streams) : stream_(static_cast<cudaStream_t>(streams.current())) {}
  ~EventClock() override {
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  }
  void mark() override {
    cudaEvent_t event = nullptr;
    SMLA_CUDA_CHECK(cudaEventCreate(&event));
    marks_.push_back(event);
    SMLA_CUDA_CHECK(cudaEventRecord(event, stream_));
  }
  std::vector<double> intervals() override {
    std::vector<double> seconds;
    if (marks_.empty()) return seconds;
    SMLA_CUDA_CHECK(cudaEventSynchronize(marks_.back()));
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      SMLA_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1], marks_[i]));
      seconds.push_back(ms * 1e-3);
    }
    return seconds;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> marks_;
};
#endif

}  // namespace

std::unique_ptr<StepClock> make_clock([[maybe_unused]] Streams& streams) {
#if SMLA_WITH_CUDA
  if (streams.device().kind == DeviceKind::cuda) return std::make_unique<EventClock>(streams);
#endif
  return std::make_unique<HostClock>();
}

}  // namespace smla::cli
