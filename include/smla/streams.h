// How a decode step orders its work on a device: the current stream, a side stream for forked
// table builds, reusable events, and memory. On the CPU every call runs in order on the
// caller's thread, so ordering is trivial; on CUDA these are the caller's cudaStream_t, a side
// stream, one cudaEvent per event slot, and a block cache that also serves graph captures.
#pragma once
#include <cstddef>
#include <memory>

#include "smla/tensor.h"

namespace smla {

class Streams {
 public:
  virtual ~Streams() = default;
  virtual Device device() const = 0;
  virtual void* current() const = 0;  // stream handle the step's layers run on
  virtual void* side() const = 0;     // stream handle forked builds run on
  // Creates event slots 0..count-1 (before any graph capture); record/wait use only these.
  virtual void reserve_events(int count) = 0;
  virtual void fork() = 0;             // the side stream waits for the current one's work so far
  virtual void record(int event) = 0;  // the slot marks the side stream's work so far
  virtual void wait(int event) = 0;    // the current stream waits for the slot's mark
  virtual void join() = 0;             // the current stream waits for all side-stream work
  // Uninitialized memory on device() (callers write what they read; see zero). It is released
  // when its last owner drops it, to be reused by work queued after that on the current stream
  // (or on the side stream after a later fork). On CUDA, inside a graph capture, only blocks an
  // eager step has released can be served: a capture must follow one eager step of its shape,
  // and its graph, which keeps using the blocks it was served, replays on the current stream.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  // As allocate, for state kept from launch to launch (the split counters): memory no earlier
  // owner held, so that no graph captured with it (and replayed since) writes there. On CUDA a
  // new block of the device's each call (the cache grows by it), not inside a graph capture.
  virtual std::shared_ptr<void> allocate_persistent(size_t bytes) = 0;
  // Zeroes `bytes` at `dst` on the current stream; not inside a graph capture.
  virtual void zero(void* dst, size_t bytes) = 0;
  // Host <-> device() copies on the current stream; each returns once the copy is done. These
  // three wait for the stream, so on CUDA a capturing stream refuses them (unsupported) and the
  // capture goes on.
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;  // returns when the current stream's work is done
};

// The streams of `device` around `stream` (a cudaStream_t there, which must outlive them;
// ignored on the CPU). The side stream is the library's own (non-blocking). Refused: a stream
// being captured (unsupported: make the Streams before capturing) or of another device (value),
// a device neither cpu nor cuda (type).
// One thread at a time.
std::unique_ptr<Streams> make_streams(Device device, void* stream = nullptr);

}  // namespace smla
