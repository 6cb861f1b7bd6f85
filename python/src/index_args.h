// `_smla.StepMetadata` and `_smla.IndexArgs`: smla::StepMetadata / SparseIndexArgs together
// with the arrays their views point into, so that tables (which call back for build arguments)
// and executors can hold them past the Python call.
#pragma once
#include <vector>

#include "smla/index.h"
#include "tensor_arg.h"

namespace smla::py {

struct StepArgs {
  StepMetadata step;
  std::vector<nb::object> keep;
};

struct IndexArgs {
  SparseIndexArgs args;
  std::vector<nb::object> keep;
};

// The StepMetadata of a `_smla.StepMetadata` handle, which `keep` then holds.
inline StepMetadata take_step(nb::handle step, std::vector<nb::object>& keep) {
  keep.push_back(nb::borrow(step));
  return nb::cast<const StepArgs&>(step).step;
}

}  // namespace smla::py
