// IEEE's default float environment for a scope, so that the CPU quantizer and decode round as
// the CUDA ones (to nearest even, subnormals kept) whatever mode their caller set
// (torch.set_flush_denormal, -ffast-math code, fesetround).
#pragma once
#include <cstdint>
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace smla::cpu {

// Clears the flush-to-zero and rounding-direction modes until the scope ends, then restores the
// caller's: on x86 MXCSR's flush-to-zero (bit 15), denormals-are-zero (bit 6) and rounding
// control (bits 13-14, 0 = to nearest), on AArch64 FPCR.FZ (bit 24) and FPCR.RMode (bits
// 22-23). Other architectures have no such mode to clear here.
class IeeeDefaultMode {
 public:
  IeeeDefaultMode() {
#if defined(__x86_64__) || defined(__SSE2__)
    saved_ = _mm_getcsr();
    _mm_setcsr(static_cast<unsigned>(saved_ & ~uint64_t{0xe040}));
#elif defined(__aarch64__)
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    asm volatile("msr fpcr, %0" : : "r"(saved_ & ~(uint64_t{7} << 22)));
#endif
  }
  ~IeeeDefaultMode() {
#if defined(__x86_64__) || defined(__SSE2__)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    asm volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  IeeeDefaultMode(const IeeeDefaultMode&) = delete;
  IeeeDefaultMode& operator=(const IeeeDefaultMode&) = delete;

 private:
  [[maybe_unused]] uint64_t saved_ = 0;
};

}  // namespace smla::cpu
