#include "core/check.h"

namespace smla::check {

void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
          const std::string& got) {
  throw Error(kind, argument, expected, got);
}

std::string shape_of(const TensorView& v) {
  std::string s = "[";
  for (int d = 0; d < v.ndim; ++d) s += (d ? ", " : "") + std::to_string(v.shape[d]);
  return s + "]";
}

void tensor(const TensorView& v, const char* name, DType dtype, Device device,
            std::initializer_list<int64_t> shape, const std::string& expected) {
  if (!v.defined()) fail(ErrorKind::value, name, "a " + expected + " tensor", "absent");
  if (v.dtype != dtype) fail(ErrorKind::type, name, dtype_name(dtype), dtype_name(v.dtype));
  if (!(v.device == device))
    fail(ErrorKind::type, name, device_name(device) + " (the device of the call)",
         device_name(v.device));
  bool ok = v.ndim == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t size : shape) ok = ok && (size < 0 || v.shape[d] == size), ++d;
  for (int i = 0; i < v.ndim; ++i) ok = ok && v.shape[i] >= 0;
  if (!ok) fail(ErrorKind::value, name, expected, shape_of(v));
  if (v.numel() > 0 && v.data == nullptr) fail(ErrorKind::value, name, "data", "a null pointer");
}

}  // namespace smla::check
