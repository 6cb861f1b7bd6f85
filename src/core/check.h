// Argument checks shared by the index builders and the step machinery: each throws smla::Error
// naming the argument, what was expected and what came.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "smla/error.h"
#include "smla/tensor.h"

namespace smla::check {

[[noreturn]] void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
                       const std::string& got);

std::string shape_of(const TensorView& view);  // "[4, 128]"

// A present tensor of `dtype` on `device` whose sizes match `shape` (-1 = any size), with
// non-negative sizes and data behind it; `expected` describes the shape for the message.
void tensor(const TensorView& view, const char* name, DType dtype, Device device,
            std::initializer_list<int64_t> shape, const std::string& expected);

// Element i of a 1-D i32 view / element (i, j) of a 2-D one (host memory).
inline int32_t at(const TensorView& v, int64_t i) {
  return v.ptr<const int32_t>()[i * v.strides[0]];
}
inline int32_t at(const TensorView& v, int64_t i, int64_t j) {
  return v.ptr<const int32_t>()[i * v.strides[0] + j * v.strides[1]];
}

}  // namespace smla::check
