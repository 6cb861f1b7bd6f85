// Unsigned division of x < 2^31 by a divisor fixed at launch: one multiply-high and a shift
// where the hardware's integer division is a ~25-instruction sequence through a reciprocal.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace smla {

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t magic = 0;  // 0: divisor 1
  uint32_t shift = 0;

  FastDiv() = default;
  // magic = ceil(2^(31 + l) / d), l = ceil(log2 d): exact for every x < 2^31. magic exceeds
  // 2^(31 + l) / d by less than 1, so x * magic / 2^(31 + l) exceeds x / d by less than
  // x / 2^(31 + l) < 2^-l <= 1 / d, which never carries past the next integer.
  explicit FastDiv(uint32_t d) : divisor(d) {
    if (d <= 1) return;
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    magic = uint32_t(((uint64_t(1) << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }

  SMLA_HOST_DEVICE uint32_t div(uint32_t x) const {
#if defined(__CUDA_ARCH__)
    return magic ? __umulhi(x, magic) >> shift : x;
#else
    return magic ? uint32_t((uint64_t(x) * magic) >> 32) >> shift : x;
#endif
  }
};

}  // namespace smla
