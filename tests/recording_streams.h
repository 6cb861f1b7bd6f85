// Streams for host tests: the CPU's, logging each ordering call, or with bounded memory.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cpu/streams.h"
#include "smla/streams.h"

namespace smla::test {

// The CPU's streams, logging each ordering call; allocations come poisoned (0xa5 bytes), as
// the contract allows, so a table that relied on zeroed memory would differ from a direct build.
class RecordingStreams final : public Streams {
 public:
  Device device() const override { return inner_->device(); }
  void* current() const override { return inner_->current(); }
  void* side() const override { return inner_->side(); }
  void reserve_events(int n) override { log.push_back("reserve " + std::to_string(n)); }
  void fork() override { log.push_back("fork"); }
  void record(int e) override { log.push_back("record " + std::to_string(e)); }
  void wait(int e) override { log.push_back("wait " + std::to_string(e)); }
  void join() override { log.push_back("join"); }
  std::shared_ptr<void> allocate(size_t bytes) override {
    std::shared_ptr<void> memory = inner_->allocate(bytes);
    std::memset(memory.get(), 0xa5, bytes);
    return memory;
  }
  std::shared_ptr<void> allocate_persistent(size_t bytes) override {
    std::shared_ptr<void> memory = inner_->allocate_persistent(bytes);
    std::memset(memory.get(), 0xa5, bytes);
    return memory;
  }
  void zero(void* d, size_t n) override { inner_->zero(d, n); }
  void upload(void* d, const void* s, size_t n) override { inner_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { inner_->download(d, s, n); }
  void synchronize() override { inner_->synchronize(); }
  std::vector<std::string> log;

  // How many times `entry` was logged.
  int64_t count(const std::string& entry) const {
    return std::count(log.begin(), log.end(), entry);
  }

 private:
  std::unique_ptr<Streams> inner_ = make_streams(Device{});
};

// The CPU's streams with `limit` bytes to hand out an allocation: a larger one is
// std::bad_alloc, as on a machine out of memory.
class BoundedHostStreams final : public cpu::HostStreams {
 public:
  explicit BoundedHostStreams(size_t limit) : limit_(limit) {}
  std::shared_ptr<void> allocate(size_t bytes) override {
    if (bytes > limit_) throw std::bad_alloc();
    return cpu::HostStreams::allocate(bytes);
  }

 private:
  size_t limit_;
};

}  // namespace smla::test
