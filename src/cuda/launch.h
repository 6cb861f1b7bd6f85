// Kernel launches that overlap their start-up with the end of the previous kernel on the stream
// (programmatic dependent launch; captured as programmatic edges in a CUDA graph).
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "cuda/check.h"
#include "cuda/device.h"

namespace smla::cuda {

// The launch attribute for clusters of `size` consecutive CTAs along x.
inline cudaLaunchAttribute cluster_attribute(int size) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = unsigned(size);
  a.val.clusterDim.y = a.val.clusterDim.z = 1;
  return a;
}

// Every CTA of `kernel` must call ptx::griddep_wait(), unconditionally, before it reads or
// writes global memory that earlier work on the stream may touch: a CTA that exits without
// waiting would let the next kernel run ahead of the one before this. `cluster` > 1 launches
// clusters of that many consecutive CTAs (grid.x a multiple of it). A failed launch's error
// names `name` and the launch's shape, or "stream" where that is another device's.
template <class... Params, class... Args>
void launch_early(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t smem_bytes, cudaStream_t stream, int cluster, Args&&... args) {
  cudaLaunchAttribute attrs[2]{{}, cluster_attribute(cluster)};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = cluster > 1 ? 2 : 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status == cudaSuccess) return;
  const std::string what = std::string("the launch of ") + name + " (" + std::to_string(grid.x) +
                           " CTAs of " + std::to_string(block.x) + " threads, clusters of " +
                           std::to_string(cluster) + ", " + std::to_string(smem_bytes) +
                           " B of shared memory)";
  (void)cudaGetLastError();  // as check() does, also when the stream is what is refused
  require_stream_of(stream, current_device());
  check(status, what.c_str());
}

}  // namespace smla::cuda
