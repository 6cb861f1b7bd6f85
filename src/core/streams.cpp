// The Streams of a device: the CPU's now; a CUDA one (side stream, events) plugs in here.
#include "cpu/streams.h"

#include "core/check.h"

namespace smla {

std::unique_ptr<Streams> make_streams(Device device, void* stream) {
  if (device.kind == DeviceKind::cpu) return cpu::make_streams();
  (void)stream;
  check::fail(ErrorKind::unsupported, "device",
              "cpu (CUDA streams for the step are not written yet)", device_name(device));
}

}  // namespace smla
