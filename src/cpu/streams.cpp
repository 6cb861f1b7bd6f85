#include "cpu/streams.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace smla::cpu {

std::shared_ptr<void> HostStreams::allocate(size_t bytes) {
  void* memory = std::malloc(bytes ? bytes : 1);
  if (!memory) throw std::bad_alloc();
  return {memory, std::free};
}

std::shared_ptr<void> HostStreams::allocate_persistent(size_t bytes) {
  return HostStreams::allocate(bytes);  // new memory (not a derived class's cache)
}

// A copy of 0 bytes may come with null pointers (an empty vector's data()), which the C
// library's calls may not be given.
void HostStreams::zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}
void HostStreams::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostStreams::download(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

std::unique_ptr<Streams> make_streams() { return std::make_unique<HostStreams>(); }

}  // namespace smla::cpu
