// Eight-lane float and double vectors (GNU vector extensions: one AVX-512 or AVX2 register or a
// few SSE ones, lane by lane the scalar IEEE operations), and SMLA_CPU_CLONES, which compiles a
// hot loop's function for AVX-512 and AVX2 beside the baseline ISA, one picked when the library
// loads (GNU ifunc). The library compiles with -ffp-contract=off (no fused multiply-add), so every
// clone gives the same bits. -DSMLA_CPU_CLONES= builds the baseline (or -march's) code alone.
#pragma once
#include <cstddef>  // __GLIBC__

#include "core/sanitizers.h"

// GCC only: Clang (14, this machine's) clones no function template. glibc only: ifunc (musl
// has none, and GCC refuses the attribute there). Not under ThreadSanitizer: an ifunc resolver
// runs before its runtime starts (the tests crashed at load).
#if !defined(SMLA_CPU_CLONES) && defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && \
    !defined(__clang__) && !defined(SMLA_TSAN)
#define SMLA_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#ifndef SMLA_CPU_CLONES
#define SMLA_CPU_CLONES
#endif

namespace smla::cpu {

// Element-aligned and aliasing, so that any 8 consecutive values can be viewed as one.
using F8 = float __attribute__((vector_size(32), aligned(4), may_alias));
using D8 = double __attribute__((vector_size(64), aligned(8), may_alias));

// The 8 values at p as a vector (never passed by value: no call's ABI depends on the ISA).
template <class V, class T>
V& at8(T* p) {
  return *reinterpret_cast<V*>(p);
}
template <class V, class T>
const V& at8(const T* p) {
  return *reinterpret_cast<const V*>(p);
}

// Sum of 8 float lanes, as a pairwise tree.
inline float sum8(const F8& x) {
  return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

}  // namespace smla::cpu
