// The board's power from its energy counter (NVML, loaded at run time, so that the benchmark still
// starts where no driver provides it, as its usage does on a machine without a GPU).
#pragma once
#include <functional>

namespace smla::bench {

// Runs `work`; the board's mean power over it in watts, 0 where the counter is not there.
double mean_board_watts(int device, const std::function<void()>& work);

}  // namespace smla::bench
