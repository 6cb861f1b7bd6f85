// The board's power from its energy counter (NVML, loaded at run time, so that the benchmarks still
// start where no driver provides it, as their usage does on a machine without a GPU). Shared by
// smla_bench and smla_step_bench.
#pragma once
#include <functional>

namespace smla::cli {

// Runs `work`; the board's mean power over it in watts, 0 where the counter is not there (or
// CUDA is not built).
double mean_board_watts(int device, const std::function<void()>& work);

}  // namespace smla::cli
