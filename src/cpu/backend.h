// The CPU backend: the executable reference of SPEC §2 that the GPU is checked against.
#pragma once
#include "core/problem.h"

namespace smla::cpu {

// SPEC §2 on host memory, multithreaded over (token, block of heads) units: each 64-value dot
// product in float32, the groups' sums, scales, softmax and outputs in float64 (decode.cpp).
void decode(const DecodeProblem& problem, const DecodeArgs& args);

}  // namespace smla::cpu
