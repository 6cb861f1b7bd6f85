// Ceilings measured in the same run as the kernel: random-row gather bandwidth and the
// bf16 and e4m3 dense matmul rates (cuBLAS), which together give each shape's roofline floor.
#pragma once

namespace smla::bench {

// Bytes/s of gathering random `row_bytes` rows (512..1024, a multiple of 16) from a pool far
// larger than L2.
double measure_gather_bandwidth(int row_bytes);
// FLOP/s of an 8192^3 bf16 GEMM with f32 accumulation; `sustained_ms` as median_graph_ms.
double measure_bf16_matmul_rate(double sustained_ms = 0);
// FLOP/s of an 8192^3 e4m3 GEMM (cuBLASLt) with f32 accumulation and bf16 output.
double measure_e4m3_matmul_rate();

}  // namespace smla::bench
