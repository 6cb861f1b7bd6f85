#include "core/block_cache.h"

#include <algorithm>
#include <bit>
#include <string>

#include "core/check.h"

namespace smla {

std::shared_ptr<BlockCache> BlockCache::create(RawMemory memory) {
  return std::shared_ptr<BlockCache>(new BlockCache(std::move(memory)));
}

BlockCache::~BlockCache() {
  // Every block is free here: a live one would have kept the cache alive.
  for (auto& [size, bucket] : buckets_)
    for (void* block : bucket.free) memory_.release(block);
}

size_t BlockCache::rounded(size_t bytes) {
  const size_t n = std::max<size_t>(bytes, 1);
  const size_t step = std::max(kGranule, std::bit_floor(n) / 4);
  return n > SIZE_MAX - (step - 1) ? 0 : (n + step - 1) / step * step;
}

std::shared_ptr<void> BlockCache::allocate(size_t bytes, bool fresh) {
  const size_t size = rounded(bytes);
  if (size == 0)  // rounded up, it would wrap to a small block
    check::fail(ErrorKind::value, "allocate", "a block size that rounds up within size_t",
                std::to_string(bytes) + " B");
  void* block = nullptr;
  {
    const std::lock_guard lock(mutex_);
    Bucket& bucket = buckets_[size];
    if (!fresh && !bucket.free.empty()) {
      block = bucket.free.back();
      bucket.free.pop_back();
    } else {
      // A capture would record the allocation as a graph node, or fail: the memory a captured
      // step uses must already be in the cache, which no eager step fills with a fresh block.
      if (memory_.capturing()) {
        if (fresh)
          check::fail(ErrorKind::unsupported, "allocate",
                      "a new block of " + std::to_string(size) +
                          " B (state kept across launches) outside any CUDA-graph capture (make "
                          "its owner, such as a StepExecutor, before capturing)",
                      "a capture in progress");
        check::fail(ErrorKind::unsupported, "allocate",
                    "a free block of " + std::to_string(size) +
                        " B during a CUDA-graph capture (run one eager step of the same shape "
                        "before capturing it)",
                    "none in the cache");
      }
      bucket.free.reserve(bucket.blocks + 1);  // so that giving a block back never allocates
      block = memory_.allocate(size);
      ++bucket.blocks;
      ++blocks_;
      bytes_ += size;
    }
  }
  return {block, [cache = shared_from_this(), size](void* b) { cache->give_back(size, b); }};
}

void BlockCache::give_back(size_t size, void* block) {
  const std::lock_guard lock(mutex_);
  buckets_.at(size).free.push_back(block);
}

size_t BlockCache::blocks() const {
  const std::lock_guard lock(mutex_);
  return blocks_;
}

size_t BlockCache::bytes() const {
  const std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace smla
