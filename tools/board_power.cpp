#include "board_power.h"

#include <chrono>
#include <optional>

#if SMLA_WITH_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

namespace smla::cli {
namespace {

#if SMLA_WITH_CUDA
// The few NVML entry points used, declared here: the toolkit ships no nvml.h.
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlInit = int (*)();
using NvmlHandleByPciBusId = int (*)(const char*, NvmlDevice*);
using NvmlTotalEnergy = int (*)(NvmlDevice, unsigned long long*);

struct Nvml {
  NvmlHandleByPciBusId handle_by_pci_bus_id = nullptr;
  NvmlTotalEnergy total_energy = nullptr;

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    const auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
    if (!init || init() != 0) return;  // NVML_SUCCESS is 0
    handle_by_pci_bus_id =
        reinterpret_cast<NvmlHandleByPciBusId>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    total_energy =
        reinterpret_cast<NvmlTotalEnergy>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
  }
};

// Millijoules the board of CUDA device `device` has used since its driver loaded; nullopt where
// NVML or the counter is not there.
std::optional<double> board_energy_mj(int device) {
  static const Nvml nvml;  // loaded once; never unloaded (the process ends with it)
  if (!nvml.handle_by_pci_bus_id || !nvml.total_energy) return std::nullopt;
  char bus_id[32];
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    (void)cudaGetLastError();  // cleared, so that a later launch's check does not report it
    return std::nullopt;
  }
  NvmlDevice handle = nullptr;
  unsigned long long mj = 0;
  if (nvml.handle_by_pci_bus_id(bus_id, &handle) != 0 || nvml.total_energy(handle, &mj) != 0)
    return std::nullopt;
  return double(mj);
}
#else
std::optional<double> board_energy_mj(int) { return std::nullopt; }
#endif

}  // namespace

double mean_board_watts(int device, const std::function<void()>& work) {
  const auto before = board_energy_mj(device);
  const auto start = std::chrono::steady_clock::now();
  work();
  const auto after = board_energy_mj(device);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  return before && after && seconds.count() > 0 ? (*after - *before) * 1e-3 / seconds.count() : 0;
}

}  // namespace smla::cli
