// Per-device facts the launchers need, read once per device and cached.
#pragma once
#include <string>

#include "smla/tensor.h"

namespace smla::cuda {

int sm_count(int device);
int current_device();

// Throws ErrorKind::unsupported naming `argument` unless `ok`.
void require(bool ok, const char* argument, const std::string& expected, const std::string& got);
// Throws ErrorKind::unsupported naming `argument` unless `device` is a Hopper GPU that this
// build runs on and the current CUDA device (launches go to the current device).
void require_usable(Device device, const char* argument);

}  // namespace smla::cuda
