// Subnormals kept in float arithmetic for a scope, so that the CPU quantizer rounds as the CUDA
// one (IEEE, no flush) whatever mode its caller set (torch.set_flush_denormal, -ffast-math code).
#pragma once
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace smla::cpu {

// Clears x86's flush-to-zero (MXCSR bit 15) and denormals-are-zero (bit 6) modes until the
// scope ends, then restores the caller's. Other architectures: nothing (no such mode is set by
// default there).
class KeepSubnormals {
#if defined(__x86_64__) || defined(__SSE2__)
 public:
  KeepSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
  ~KeepSubnormals() { _mm_setcsr(saved_); }
  KeepSubnormals(const KeepSubnormals&) = delete;
  KeepSubnormals& operator=(const KeepSubnormals&) = delete;

 private:
  unsigned saved_;
#endif
};

}  // namespace smla::cpu
