// The CUDA Streams (streams.h): the caller's stream, one side stream, event slots, and a block
// cache that serves allocations inside graph captures.
#pragma once
#include <memory>

#include "smla/streams.h"

namespace smla::cuda {

// Throws smla::Error (unsupported) when `device` cannot run the kernels.
std::unique_ptr<Streams> make_streams(Device device, void* stream);

}  // namespace smla::cuda
