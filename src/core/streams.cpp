// The Streams of a device: the CPU's in-order no-ops, or (in CUDA builds) the CUDA ones.
#include "cpu/streams.h"

#include "core/check.h"
#if SMLA_WITH_CUDA
#include "cuda/streams.h"
#endif

namespace smla {

std::unique_ptr<Streams> make_streams(Device device, void* stream) {
  check::device(device, "device");
  if (device.kind == DeviceKind::cpu) return cpu::make_streams();
#if SMLA_WITH_CUDA
  return cuda::make_streams(device, stream);
#else
  (void)stream;
  check::fail(ErrorKind::unsupported, "device", "cpu (this build has no CUDA backend)",
              device_name(device));
#endif
}

}  // namespace smla
