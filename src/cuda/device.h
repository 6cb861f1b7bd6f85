// Per-device facts the launchers need, read once per device and cached.
#pragma once

namespace smla::cuda {

int sm_count(int device);
int current_device();

}  // namespace smla::cuda
