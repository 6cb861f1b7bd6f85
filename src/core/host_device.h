// SMLA_HOST_DEVICE marks the core's small inline functions that CUDA kernels call too, so that
// both backends compute them with the same code; plain inline for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define SMLA_HOST_DEVICE __host__ __device__
#else
#define SMLA_HOST_DEVICE
#endif
