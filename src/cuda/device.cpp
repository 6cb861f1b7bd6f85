#include "cuda/device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>

#include "cuda/backend.h"
#include "cuda/check.h"

namespace smla::cuda {

void require_device_id(int device, const char* argument) {
  if (device < 0)
    throw Error(ErrorKind::value, argument, "a CUDA device index >= 0", std::to_string(device));
}

void require_device_index(int device, int count) {
  require_device_id(device, "device");
  require(
      device < count, "device",
      [&] { return "a CUDA device index below " + std::to_string(count); },
      [&] { return std::to_string(device); });
}

namespace {

// A device attribute, asked once a device (0: not yet asked, or not reported, then asked again).
template <cudaDeviceAttr kAttribute>
int attribute(int device) {
  static PerDevice<std::atomic<int>> cache;
  std::atomic<int>& cached = cache.at(device);
  int value = cached.load(std::memory_order_relaxed);
  if (value == 0) {
    SMLA_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttribute, device));
    cached.store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int sm_count(int device) { return attribute<cudaDevAttrMultiProcessorCount>(device); }

double dram_bytes_per_us(int device) {  // kHz: cycles a ms; HBM moves data on both edges
  return 2e-3 * attribute<cudaDevAttrMemoryClockRate>(device) *
         attribute<cudaDevAttrGlobalMemoryBusWidth>(device) / 8;
}

int current_device() {
  int device = 0;
  SMLA_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

namespace {

// Why cudaGetDeviceCount failed, its error taken off the thread's last-error state. Without any
// driver the runtime says "insufficient driver", which would send the user to update one.
std::string count_failure(cudaError_t e) {
  (void)cudaGetLastError();
  int driver = 0;
  if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
      driver == 0)
    return "no NVIDIA driver is loaded (no GPU on this machine?)";
  return "cudaGetDeviceCount failed: " + describe(e);
}

}  // namespace

std::string unsupported_reason(int device) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return count_failure(e);
  if (count == 0) return "no CUDA device is visible";
  if (device < 0 || device >= count)
    return "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " visible)";
  // The per-device caches (sm_count, the decode's occupancy) hold this many.
  if (device >= PerDevice<int>::kDevices)
    return "CUDA device " + std::to_string(device) + " is past the first " +
           std::to_string(PerDevice<int>::kDevices) + ", the devices this library runs on";
  int major = 0, minor = 0;
  for (const auto& [value, attribute] : {std::pair{&major, cudaDevAttrComputeCapabilityMajor},
                                         std::pair{&minor, cudaDevAttrComputeCapabilityMinor}})
    if (const cudaError_t e = cudaDeviceGetAttribute(value, attribute, device); e != cudaSuccess) {
      (void)cudaGetLastError();
      return "its compute capability could not be read: " + describe(e);
    }
  if (major != 9 || minor != 0)
    return "the kernels are built for sm_90a (Hopper, compute capability 9.0); device " +
           std::to_string(device) + " is " + std::to_string(major) + "." + std::to_string(minor);
  return {};
}

void fail_unsupported(const char* argument, const std::string& expected, const std::string& got) {
  throw Error(ErrorKind::unsupported, argument, expected, got);
}

void require_supported(int device, const char* argument) {
  require_device_id(device, argument);
  // A fact of the hardware: asked once a device (three runtime calls), then read from here.
  static PerDevice<std::atomic<bool>> supported;
  const bool cached = device < decltype(supported)::kDevices;  // else unsupported_reason says so
  if (cached && supported.at(device).load(std::memory_order_relaxed)) return;
  const std::string why = unsupported_reason(device);
  require(why.empty(), argument, "a Hopper GPU that this build runs on",
          [&] { return "cuda:" + std::to_string(device) + ": " + why; });
  supported.at(device).store(true, std::memory_order_relaxed);
}

void require_stream_of(cudaStream_t stream, int device) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  int owner = device;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone || cudaStreamGetDevice(stream, &owner) != cudaSuccess) {
    (void)cudaGetLastError();  // an unanswered question is not the caller's error
    return;
  }
  if (owner != device)
    throw Error(ErrorKind::value, "stream",
                "a stream of " + device_name({DeviceKind::cuda, device}),
                "a stream of " + device_name({DeviceKind::cuda, owner}));
}

void require_aligned(const TensorView& view, const char* argument, size_t bytes) {
  require(
      !view.defined() || aligned(view.data, bytes), argument,
      [&] { return std::to_string(bytes) + "-byte aligned " + dtype_name(view.dtype) + " data"; },
      [&] { return misalignment(view.data, bytes); });
}

std::string misalignment(const void* p, size_t bytes) {
  return "data " + std::to_string(reinterpret_cast<uintptr_t>(p) % bytes) + " bytes past a " +
         std::to_string(bytes) + "-byte boundary";
}

void require_usable(Device device, const char* argument) {
  require_supported(device.id, argument);
  const int current = current_device();
  require(
      current == device.id, argument,
      [&] { return "a tensor on the current CUDA device (cuda:" + std::to_string(current) + ")"; },
      [&] { return device_name(device); });
}

std::string device_info() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
    return "cuda: " + count_failure(e) + "\n";
  if (count == 0) return "cuda: no device visible\n";
  std::string info;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    SMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    const std::string why = unsupported_reason(d);
    info += "cuda:" + std::to_string(d) + ": " + prop.name + ", " +
            std::to_string(prop.multiProcessorCount) + " SMs, " +
            std::to_string(prop.totalGlobalMem >> 30) + " GiB, sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ": " +
            (why.empty() ? "supported (bf16, fp8_e4m3 and fp8_ds_mla caches; 1..128 heads)"
                         : "unsupported: " + why) +
            "\n";
  }
  return info;
}

}  // namespace smla::cuda
