// `_smla.IndexArgs`: a smla::SparseIndexArgs together with the arrays its views point into, so
// that tables (which call back for build arguments) can hold them past the Python call.
#pragma once
#include <vector>

#include "smla/index.h"
#include "tensor_arg.h"

namespace smla::py {

struct IndexArgs {
  SparseIndexArgs args;
  std::vector<nb::object> keep;
};

}  // namespace smla::py
