// A validated quantize_kv call: the pool's geometry read once, shared by the backends.
#pragma once
#include <cstdint>

#include "core/problem.h"
#include "smla/quantize.h"

namespace smla {

struct QuantizeProblem {
  int64_t num_rows = 0;  // N
  float kv_scale = 1.0f;
  KvPool pool;  // its layout says how rows are encoded
  Device device;
};

// Checks every argument (dtype, device, shape, kv_scale; slot values when they are host
// tensors) and throws smla::Error naming the first bad one.
QuantizeProblem validate_quantize(const TensorView& rows, const TensorView& slots,
                                  const TensorView& pool, float kv_scale);

}  // namespace smla
