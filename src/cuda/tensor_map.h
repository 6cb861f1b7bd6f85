// TMA tensor maps of bf16 and e4m3 tensors, boxes landing 128B-swizzled as the decode kernel's
// tiles are.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace smla::cuda {

// A tensor of bf16 (or, `bytes`, of one-byte elements: e4m3) of `rank` (2..5) dims, innermost
// first and contiguous, `byte_strides` of dims 1..rank-1, read in `box` boxes (innermost 128
// bytes: one 128-byte swizzle row); elements past `dims` arrive as zeros. False where the
// driver refuses the tensor (strides not 16-byte multiples or of 2^40 bytes and more; a zero
// stride is taken: measured, docs/kernel_measured.md); throws a runtime error naming `argument` on
// any other driver error.
bool tensor_map(CUtensorMap* map, const void* base, bool bytes, int rank, const uint64_t* dims,
                const uint64_t* byte_strides, const uint32_t* box, const char* argument);

}  // namespace smla::cuda
