// The CPU's Streams: nothing to order, every build and layer runs in turn on the caller's thread.
#pragma once
#include <memory>

#include "smla/streams.h"

namespace smla::cpu {

std::unique_ptr<Streams> make_streams();

}  // namespace smla::cpu
