// BlockCache, the allocator of the CUDA Streams, on host memory: reuse by size, blocks that keep
// the cache alive, and captures served only from blocks an eager step released.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/block_cache.h"
#include "cpu/streams.h"
#include "error_check.h"
#include "smla/error.h"
#include "smla/tables.h"
#include "step_case.h"

namespace smla {
namespace {

// The largest request that rounds up within a 64-bit size_t: the largest class that fits (the
// last octave's fourth, 2^64, does not).
constexpr size_t kLargest = size_t(7) << 61;
static_assert(sizeof(size_t) == 8);

// Host memory standing in for a device's, counting what the cache takes and gives back.
struct FakeDevice {
  int allocations = 0, releases = 0;
  bool capturing = false;
  RawMemory memory() {
    return {.allocate =
                [this](size_t bytes) {
                  ++allocations;
                  return std::malloc(bytes);
                },
            .release =
                [this](void* block) {
                  ++releases;
                  std::free(block);
                },
            .capturing = [this] { return capturing; }};
  }
};

TEST(BlockCache, ReusesAReleasedBlockOfItsSize) {
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  void* first = cache->allocate(1000).get();  // dropped at once
  EXPECT_EQ(cache->allocate(1000).get(), first);
  EXPECT_EQ(cache->allocate(600).get(), first);  // 600 and 1000 both round to 1024
  EXPECT_NE(cache->allocate(1025).get(), first);
  EXPECT_EQ(device.allocations, 2);
  EXPECT_EQ(cache->blocks(), 2u);
  EXPECT_EQ(cache->bytes(), 1024u + 1536u);
  // A size past the largest that rounds up within size_t would wrap to a 0-byte block: refused
  // by name, nothing asked of the device.
  test::expect_smla_error([&] { cache->allocate(kLargest + 1); }, ErrorKind::value, "allocate",
                          "rounds up within size_t", std::to_string(kLargest + 1) + " B");
  EXPECT_EQ(device.allocations, 2);
}

TEST(BlockCache, HeldBlocksAreDistinctAndAllComeBack) {
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  std::vector<std::shared_ptr<void>> held;
  for (int i = 0; i < 3; ++i) held.push_back(cache->allocate(0));  // 0 bytes: one granule
  EXPECT_EQ(std::set<void*>({held[0].get(), held[1].get(), held[2].get()}).size(), 3u);
  held.clear();
  for (int i = 0; i < 3; ++i) held.push_back(cache->allocate(BlockCache::kGranule));
  // The same three again, each to one holder.
  EXPECT_EQ(std::set<void*>({held[0].get(), held[1].get(), held[2].get()}).size(), 3u);
  EXPECT_EQ(device.allocations, 3);
  EXPECT_EQ(device.releases, 0);  // grow-only
}

TEST(BlockCache, ACaptureIsServedOnlyFromTheCache) {
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  void* eager = cache->allocate(4096).get();
  device.capturing = true;
  EXPECT_EQ(cache->allocate(4096).get(), eager);
  try {
    cache->allocate(8192);
    FAIL() << "a capture allocated device memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find("eager step"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device.allocations, 1);
}

// A fresh block is a new one while blocks of its size are free (a graph captured with one of
// those may write it on every replay); once dropped it serves others.
TEST(BlockCache, AFreshBlockIsNoReleasedOne) {
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  void* released = cache->allocate(1000).get();
  std::shared_ptr<void> fresh = cache->allocate(1000, true);
  EXPECT_NE(fresh.get(), released);
  EXPECT_EQ(device.allocations, 2);
  void* fresh_block = fresh.get();
  fresh.reset();
  const std::shared_ptr<void> a = cache->allocate(1000), b = cache->allocate(1000);
  EXPECT_EQ(std::set<void*>({a.get(), b.get()}), std::set<void*>({released, fresh_block}));
  device.capturing = true;  // a capture takes no new block, fresh or not
  // No eager step would have cached a fresh block: the error says to ask before the capture.
  test::expect_smla_error([&] { cache->allocate(1000, true); }, ErrorKind::unsupported, "allocate",
                          "outside any CUDA-graph capture (make its owner, such as a StepExecutor, "
                          "before capturing)",
                          "a capture in progress");
  EXPECT_EQ(device.allocations, 2);
}

TEST(BlockCache, ABlockKeepsTheCacheAlive) {
  FakeDevice device;
  auto cache = BlockCache::create(device.memory());
  std::shared_ptr<void> block = cache->allocate(100);
  cache.reset();
  EXPECT_EQ(device.releases, 0);
  block.reset();  // the last owner: the cache goes, and its blocks with it
  EXPECT_EQ(device.releases, 1);
}

// The CPU's ordering with the cache's memory: what the CUDA Streams do, minus the device.
class CachedStreams final : public cpu::HostStreams {
 public:
  explicit CachedStreams(FakeDevice& device) : cache_(BlockCache::create(device.memory())) {}
  std::shared_ptr<void> allocate(size_t bytes) override { return cache_->allocate(bytes); }
  std::shared_ptr<void> allocate_persistent(size_t bytes) override {
    return cache_->allocate(bytes, true);
  }
  const BlockCache& cache() const { return *cache_; }

 private:
  std::shared_ptr<BlockCache> cache_;
};

// A step's tables after one eager step of the same shape take no new memory, so the same step
// can run inside a capture.
TEST(BlockCache, ACapturedStepReusesTheEagerStepsBlocks) {
  for (const char* model : {"v4-flash", "v41-flash"}) {
    const auto layers = model_layers(model_preset(model), 3, true);
    const test::StepCase c(
        layers,
        {.q_lens = {1, 2, 1}, .seq_lens = {150, 260, 40}, .num_decodes = 3, .num_groups = 3}, 5);
    FakeDevice device;
    CachedStreams streams(device);
    SparseIndexTables tables(layers, streams);
    const TableInputs inputs = [&](int layer) { return c.args(layer); };
    int eager_allocations = 0;
    for (int step = 0; step < 3; ++step) {
      device.capturing = step == 2;
      tables.reset();
      for (const LayerSpec& s : layers) tables.lookup(s.layer, inputs);
      tables.join();
      if (step == 0) eager_allocations = device.allocations;
    }
    EXPECT_GT(eager_allocations, 0) << model;
    EXPECT_EQ(device.allocations, eager_allocations) << model;
  }
}

// The device is asked for the request rounded up to the granule, and a block is reused only for
// requests it holds; the largest size that rounds within size_t is passed on.
TEST(BlockCache, AsksTheDeviceForTheRoundedSize) {
  std::vector<size_t> sizes;
  const auto cache = BlockCache::create({.allocate =
                                             [&](size_t n) {
                                               sizes.push_back(n);
                                               return std::malloc(n);
                                             },
                                         .release = [](void* b) { std::free(b); },
                                         .capturing = [] { return false; }});
  cache->allocate(600);  // dropped: serves the next 1024-byte request
  std::shared_ptr<void> block = cache->allocate(1000);
  EXPECT_EQ(sizes, std::vector<size_t>{1024});
  // The largest size that rounds up within size_t is passed on (the device refuses it).
  EXPECT_NO_THROW(cache->allocate(kLargest));
  EXPECT_EQ(sizes.back(), kLargest);
}

// Four classes an octave past 2 KiB, multiples of the granule below: a request is served at
// most 25% larger, and steps of ever new token counts share blocks. A step of six tables of
// T x 641 columns (int32, with the lengths) for every T of 1..256 leaves the cache at a few
// times one step's largest, where a list per size held ~127x.
TEST(BlockCache, SizeClassesBoundWhatNewShapesAdd) {
  EXPECT_EQ(BlockCache::rounded(0), 512u);
  EXPECT_EQ(BlockCache::rounded(2048), 2048u);
  EXPECT_EQ(BlockCache::rounded(2049), 2560u);
  EXPECT_EQ(BlockCache::rounded(4097), 5120u);
  EXPECT_EQ(BlockCache::rounded(5121), 6144u);
  EXPECT_EQ(BlockCache::rounded(kLargest), kLargest);
  EXPECT_EQ(BlockCache::rounded(kLargest + 1), 0u);
  for (size_t n = 1; n < (size_t(1) << 22); n = n * 9 / 8 + 1) {
    const size_t r = BlockCache::rounded(n);
    EXPECT_GE(r, n);
    EXPECT_EQ(r % BlockCache::kGranule, 0u) << n;
    if (n > 2048) EXPECT_LE(r, n + n / 4) << n;
  }
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  size_t largest_step = 0;
  for (size_t T = 1; T <= 256; ++T) {
    const size_t bytes = 4 * (T * 641);
    std::vector<std::shared_ptr<void>> step;
    for (int table = 0; table < 6; ++table) step.push_back(cache->allocate(bytes));
    largest_step = std::max(largest_step, 6 * bytes);
  }
  EXPECT_LE(cache->bytes(), 8 * largest_step);
  EXPECT_LE(cache->blocks(), 6u * 40);
}

// A block no free one serves, asked for during a capture, is refused, naming its size.
TEST(BlockCache, ACaptureRefusalNamesTheBlock) {
  FakeDevice device;
  const auto cache = BlockCache::create(device.memory());
  device.capturing = true;
  test::expect_smla_error([&] { cache->allocate(8192); }, ErrorKind::unsupported, "allocate",
                          "a free block of 8192 B during a CUDA-graph capture",
                          "none in the cache");
}

}  // namespace
}  // namespace smla
