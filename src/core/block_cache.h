// A grow-only cache of device memory blocks keyed by size class: what lets a CUDA-graph capture
// allocate a step's tables without allocating device memory. Eager steps fill it; a dropped
// block goes back to its class's free list at once (stream order, not a host sync, keeps its
// next user after its last: see Streams::allocate); nothing returns to the device before the
// cache itself goes, after its last block. Four classes an octave (rounded()) bound what steps
// of ever new token counts add: each class's blocks are at most what one step held of it; a
// single large allocation (an executor's workspace) may take up to 25% more than asked.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace smla {

// The device's raw memory, as the cache uses it.
struct RawMemory {
  std::function<void*(size_t bytes)> allocate;  // throws smla::Error on failure
  std::function<void(void*)> release;           // must not throw
  std::function<bool()> capturing;  // true while the stream served is being graph-captured
};

class BlockCache : public std::enable_shared_from_this<BlockCache> {
 public:
  static constexpr size_t kGranule = 512;  // the least block; every size is a multiple of it

  // The size a request of `bytes` is served at: a multiple of kGranule, and past 2 KiB one of
  // four sizes an octave (at most 25% more than asked); 0 where that would not fit in size_t.
  static size_t rounded(size_t bytes);

  static std::shared_ptr<BlockCache> create(RawMemory memory);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A free block of rounded(bytes) or a new one; the block keeps the cache alive. During a
  // capture a missing block throws smla::Error (run one eager step first). `fresh`: always a
  // new block, never one an earlier owner (and a graph it was captured into) wrote; during a
  // capture it throws whatever the cache holds (ask before capturing).
  std::shared_ptr<void> allocate(size_t bytes, bool fresh = false);

  size_t blocks() const;  // blocks taken from the device so far
  size_t bytes() const;   // their bytes

 private:
  explicit BlockCache(RawMemory memory) : memory_(std::move(memory)) {}
  void give_back(size_t size, void* block);

  RawMemory memory_;
  mutable std::mutex mutex_;
  struct Bucket {
    std::vector<void*> free;
    size_t blocks = 0;  // of this size, free or not
  };
  std::map<size_t, Bucket> buckets_;  // by rounded(size)
  size_t blocks_ = 0, bytes_ = 0;
};

}  // namespace smla
