// Ceilings measured in the same run as the kernel: random-row gather bandwidth and the
// bf16 dense matmul rate (cuBLAS), which together give each shape's roofline floor.
#pragma once
#include <cstdint>

namespace smla::bench {

// Bytes/s of gathering random `row_bytes` rows (512..1024, a multiple of 16) from a pool far
// larger than L2.
double measure_gather_bandwidth(int row_bytes);
// FLOP/s of an 8192^3 bf16 GEMM with f32 accumulation.
double measure_bf16_matmul_rate();

}  // namespace smla::bench
