// Per-device facts the launchers need, read once per device and cached.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/check.h"
#include "smla/tensor.h"

namespace smla::cuda {

// Makes `device` current for a scope: streams, events, memory, kernel attributes and occupancy
// queries act on the current one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    SMLA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) SMLA_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  // A destructor cannot throw: a failed restore leaves `device` current, and the next call for
  // the previous device is refused by require_usable (launches go to the current device).
  ~DeviceScope() {
    if (changed_) ignore_failure(cudaSetDevice(previous_));
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Throws naming `argument` (ErrorKind::value) unless device >= 0.
void require_device_id(int device, const char* argument);

// Throws naming "device" unless 0 <= device (ErrorKind::value) < count (unsupported).
void require_device_index(int device, int count);

// Per-device values a process computes once (facts of the hardware, not of a context, so a
// cudaDeviceReset leaves them true): `at` refuses indices outside the 64 devices it holds, as
// require_device_index does.
template <class T>
class PerDevice {
 public:
  static constexpr int kDevices = 64;
  T& at(int device) {
    require_device_index(device, int(values_.size()));
    return values_[device];
  }

 private:
  std::array<T, kDevices> values_{};
};

int sm_count(int device);
// The device's peak DRAM bandwidth in bytes per microsecond (memory clock x bus width x 2: HBM
// moves data on both edges); 0 where the device does not report them.
double dram_bytes_per_us(int device);
int current_device();

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
// "data 2 bytes past a 16-byte boundary": what a misaligned pointer's message says came.
std::string misalignment(const void* p, size_t bytes);

[[noreturn]] void fail_unsupported(const char* argument, const std::string& expected,
                                   const std::string& got);
// A message part: text, or a callable that builds it, so that a check passed on every launch
// builds no string.
template <class Text>
std::string message_text(const Text& text) {
  if constexpr (std::is_invocable_v<const Text&>)
    return text();
  else
    return std::string(text);
}
// Throws ErrorKind::unsupported naming `argument` unless `ok`.
template <class Expected, class Got>
void require(bool ok, const char* argument, const Expected& expected, const Got& got) {
  if (!ok) [[unlikely]]
    fail_unsupported(argument, message_text(expected), message_text(got));
}
// Throws naming `argument` unless `device` is a Hopper GPU that this build runs on:
// ErrorKind::value for a negative index, else unsupported.
void require_supported(int device, const char* argument = "device");
// Throws ErrorKind::unsupported naming `argument` unless `device` is a Hopper GPU that this
// build runs on and the current CUDA device (launches go to the current device).
void require_usable(Device device, const char* argument);
// Throws ErrorKind::value naming "stream" when `stream` belongs to another device than `device`
// (a launch there fails). A capturing stream is not asked, since cudaStreamGetDevice would end
// the capture (docs/kernel.md), nor one that the runtime cannot answer for; the null, legacy and
// per-thread streams are every device's.
void require_stream_of(cudaStream_t stream, int device);
// Throws ErrorKind::unsupported naming `argument` unless `view` (if present) starts at a multiple
// of `bytes` (what a kernel's wide accesses need past the element alignment every view has).
void require_aligned(const TensorView& view, const char* argument, size_t bytes);

}  // namespace smla::cuda
