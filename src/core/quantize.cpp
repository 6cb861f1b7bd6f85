// Entry point of quantize_kv: validation, then the backend of the pool's device.
#include "core/check.h"
#include "core/quantize_problem.h"
#include "cpu/quantize.h"
#if SMLA_WITH_CUDA
#include "cuda/quantize.h"
#endif

namespace smla {

void quantize_kv(const TensorView& rows, const TensorView& slots, const TensorView& pool,
                 float kv_scale, void* stream) {
  const QuantizeProblem problem = validate_quantize(rows, slots, pool, kv_scale);
  if (problem.device.kind == DeviceKind::cpu) return cpu::quantize_kv(problem, rows, slots);
#if SMLA_WITH_CUDA
  cuda::quantize_kv(problem, rows, slots, stream);
#else
  (void)stream;
  check::fail(ErrorKind::unsupported, "pool", "a cpu pool (this build has no CUDA backend)",
              device_name(problem.device));
#endif
}

}  // namespace smla
