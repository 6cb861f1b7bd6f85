// Runs a call under the flush-to-zero and denormals-are-zero modes that
// torch.set_flush_denormal(True) sets (x86 MXCSR bits 15 and 6), for the tests that a caller's
// mode changes no byte the library computes. Defines SMLA_TEST_FLUSH_MODES where it can.
#pragma once
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#define SMLA_TEST_FLUSH_MODES 1

namespace smla::test {

// Runs `f` with both modes set and restores the caller's mode, even when `f` throws; true when
// `f` left the modes as it found them (the library restores what it clears).
template <class F>
bool under_flush_modes(F&& f) {
  struct Restore {
    unsigned mode = _mm_getcsr();
    ~Restore() { _mm_setcsr(mode); }
  } restore;
  const unsigned flushing = restore.mode | 0x8040u;
  _mm_setcsr(flushing);
  f();
  return _mm_getcsr() == flushing;
}

}  // namespace smla::test
#endif
