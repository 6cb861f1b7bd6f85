#include "smla/tensor.h"

#include <algorithm>
#include <sstream>

#include "smla/error.h"

namespace smla {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 2;
    case DType::f8e4m3: return 1;
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

std::string device_name(Device device) {
  switch (device.kind) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::cuda:
      return "cuda:" + std::to_string(device.id);
  }
  // A kind cast from another DLPack device type: named as it is, not as a CUDA device.
  return "DLPack device type " + std::to_string(static_cast<int>(device.kind)) + " (id " +
         std::to_string(device.id) + ")";
}

// A view's fields are the caller's: a rank past kMaxDims (which validation refuses) must not
// read past shape[] or strides[] on the way there.
static int dims_held(const TensorView& v) { return std::clamp(v.ndim, 0, kMaxDims); }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < dims_held(*this); ++d) n *= shape[d];
  return ndim > 0 ? n : 0;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = dims_held(*this) - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

static TensorView view_of(void* data, DType dtype, Device device,
                          std::initializer_list<int64_t> shape) {
  if (shape.size() == 0 || shape.size() > kMaxDims)
    throw Error(ErrorKind::value, "shape", "1.." + std::to_string(kMaxDims) + " dims",
                std::to_string(shape.size()) + " dims");
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[d++] = s;
  return v;
}

TensorView make_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape) {
  TensorView v = view_of(data, dtype, device, shape);
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    if (d > 0 && __builtin_mul_overflow(stride, v.shape[d], &stride))
      throw Error(ErrorKind::value, "shape", "sizes whose row-major strides fit in int64",
                  describe(v));
  }
  return v;
}

TensorView make_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides) {
  TensorView v = view_of(data, dtype, device, shape);
  if (strides.size() != shape.size())
    throw Error(ErrorKind::value, "strides", std::to_string(shape.size()) + " strides",
                std::to_string(strides.size()));
  int d = 0;
  for (int64_t s : strides) v.strides[d++] = s;
  return v;
}

std::string describe(const TensorView& view) {
  if (!view.defined()) return "absent";
  std::ostringstream s;
  s << dtype_name(view.dtype);
  if (view.ndim > kMaxDims) {
    s << " of " << view.ndim << " dims";
  } else {
    s << "[";
    for (int d = 0; d < view.ndim; ++d) s << (d ? ", " : "") << view.shape[d];
    s << "]";
  }
  s << " " << device_name(view.device);
  return s.str();
}

}  // namespace smla
