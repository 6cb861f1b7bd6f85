// The CPU's Streams: nothing to order, every build and layer runs in turn on the caller's thread;
// memory is host memory. Tests derive from HostStreams to swap the memory or the device claimed.
#pragma once
#include <memory>

#include "smla/streams.h"

namespace smla::cpu {

class HostStreams : public Streams {
 public:
  Device device() const override { return {}; }
  void* current() const override { return nullptr; }
  void* side() const override { return nullptr; }
  void reserve_events(int) override {}
  void fork() override {}
  void record(int) override {}
  void wait(int) override {}
  void join() override {}
  std::shared_ptr<void> allocate(size_t bytes) override;
  std::shared_ptr<void> allocate_persistent(size_t bytes) override;  // HostStreams::allocate's
  void zero(void* dst, size_t bytes) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}
};

std::unique_ptr<Streams> make_streams();

}  // namespace smla::cpu
