// The CPU backend: the executable reference of SPEC §2 that the GPU is checked against.
#pragma once
#include "core/problem.h"

namespace smla::cpu {

// SPEC §2 on host memory, multithreaded over (token, head) rows; float32 arithmetic
// (float64 accumulation of the softmax denominator and the output sums).
void decode(const DecodeProblem& problem, const DecodeArgs& args);

}  // namespace smla::cpu
