// Subnormals kept in float arithmetic for a scope, so that the CPU quantizer and decode compute
// as the CUDA ones (IEEE, no flush) whatever mode their caller set (torch.set_flush_denormal,
// -ffast-math code).
#pragma once
#include <cstdint>
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace smla::cpu {

// Clears the flush-to-zero modes until the scope ends, then restores the caller's: on x86
// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6), on AArch64 FPCR.FZ (bit 24).
// Other architectures have no such mode to clear here.
class KeepSubnormals {
 public:
  KeepSubnormals() {
#if defined(__x86_64__) || defined(__SSE2__)
    saved_ = _mm_getcsr();
    _mm_setcsr(static_cast<unsigned>(saved_ & ~uint64_t{0x8040}));
#elif defined(__aarch64__)
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    asm volatile("msr fpcr, %0" : : "r"(saved_ & ~(uint64_t{1} << 24)));
#endif
  }
  ~KeepSubnormals() {
#if defined(__x86_64__) || defined(__SSE2__)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    asm volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  KeepSubnormals(const KeepSubnormals&) = delete;
  KeepSubnormals& operator=(const KeepSubnormals&) = delete;

 private:
  [[maybe_unused]] uint64_t saved_ = 0;
};

}  // namespace smla::cpu
