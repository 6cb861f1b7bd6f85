// Timing a step's layers without serializing them: marks on the run's device, read once after
// the step. The host clock on the CPU (whose calls have finished when they return); CUDA events
// on the current stream on a GPU.
#pragma once
#include <memory>
#include <vector>

#include "smla/streams.h"

namespace smla::cli {

class StepClock {
 public:
  virtual ~StepClock() = default;
  virtual void mark() = 0;  // the current stream's work so far
  // Seconds between consecutive marks; waits for the last one.
  virtual std::vector<double> intervals() = 0;
};

std::unique_ptr<StepClock> make_clock(Streams& streams);

}  // namespace smla::cli
