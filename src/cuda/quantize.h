// The CUDA quantizer: quantize_kv into a CUDA pool, byte for byte what the CPU quantizer writes
// (both encode through core/quantize_rules.h). One kernel launch on `stream`; no allocation, no
// host synchronisation, capturable. Slot values live on the device and are never checked: a row
// whose slot is negative or >= num_blocks * block_size is skipped (nothing of the pool written),
// and rows sharing a slot leave that slot's bytes undefined.
#pragma once
#include "core/quantize_problem.h"

namespace smla::cuda {

void quantize_kv(const QuantizeProblem& problem, const TensorView& rows, const TensorView& slots,
                 void* stream);

// The kernel's host entry, for tests that count its nodes in a captured graph.
const void* quantize_kernel();

}  // namespace smla::cuda
