#include "cpu/streams.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace smla::cpu {
namespace {

class HostStreams final : public Streams {
 public:
  Device device() const override { return {}; }
  void* current() const override { return nullptr; }
  void* side() const override { return nullptr; }
  void reserve_events(int) override {}
  void fork() override {}
  void record(int) override {}
  void wait(int) override {}
  void join() override {}
  std::shared_ptr<void> allocate(size_t bytes) override {
    void* memory = std::malloc(bytes ? bytes : 1);
    if (!memory) throw std::bad_alloc();
    return {memory, std::free};
  }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<Streams> make_streams() { return std::make_unique<HostStreams>(); }

}  // namespace smla::cpu
