// The CPU quantizer: bf16 rows into the pool's layout, bit for bit as docs/decode.md says.
#pragma once
#include "core/quantize_problem.h"

namespace smla::cpu {

// Writes every row with a non-negative slot; the arguments are validated.
void quantize_kv(const QuantizeProblem& problem, const TensorView& rows, const TensorView& slots);

}  // namespace smla::cpu
