// Runs a call under a float mode its caller may have set: torch.set_flush_denormal(True)'s
// flush-to-zero and denormals-are-zero (x86 MXCSR bits 15 and 6) or a rounding direction of
// fesetround (bits 13-14), for the tests that a caller's mode changes no byte the library
// computes. Defines SMLA_TEST_CALLER_FP_MODES where it can.
#pragma once
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#define SMLA_TEST_CALLER_FP_MODES 1

namespace smla::test {

struct CallerFpMode {
  const char* name;
  unsigned mxcsr_bits;
};
inline constexpr CallerFpMode kCallerFpModes[] = {
    {"flush to zero, denormals are zero", 0x8040u},
    {"rounding down", 0x2000u},
    {"rounding up", 0x4000u},
    {"rounding toward zero", 0x6000u},
};

// Runs `f` under `mode` alone and restores the caller's mode, even when `f` throws; true when
// `f` left the mode as it found it (the library restores what it clears).
template <class F>
bool under_caller_mode(const CallerFpMode& mode, F&& f) {
  struct Restore {
    unsigned mode = _mm_getcsr();
    ~Restore() { _mm_setcsr(mode); }
  } restore;
  const unsigned set = (restore.mode & ~0xe040u) | mode.mxcsr_bits;
  _mm_setcsr(set);
  f();
  return _mm_getcsr() == set;
}

}  // namespace smla::test
#endif
