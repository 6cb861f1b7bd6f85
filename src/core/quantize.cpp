// Entry point of quantize_kv: validation, then the backend of the pool's device.
#include "cpu/quantize.h"

#include "core/check.h"
#include "core/quantize_problem.h"

namespace smla {

void quantize_kv(const TensorView& rows, const TensorView& slots, const TensorView& pool,
                 float kv_scale, void* stream) {
  const QuantizeProblem problem = validate_quantize(rows, slots, pool, kv_scale);
  if (problem.device.kind == DeviceKind::cpu) return cpu::quantize_kv(problem, rows, slots);
  (void)stream;  // for the CUDA quantizer
#if SMLA_WITH_CUDA
  check::fail(ErrorKind::unsupported, "pool",
              "a cpu pool (the CUDA quantizer is not built yet; it comes with the fp8 kernels)",
              device_name(problem.device));
#else
  check::fail(ErrorKind::unsupported, "pool", "a cpu pool (this build has no CUDA backend)",
              device_name(problem.device));
#endif
}

}  // namespace smla
