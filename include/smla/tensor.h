// Non-owning strided tensor views: a DLPack DLTensor's fields, with `data` at the first element
// (no byte_offset), strides always given, and smla's five dtypes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace smla {

// Element types. `u8` is raw bytes: the dtype of an fp8_ds_mla KV pool.
enum class DType : uint8_t { bf16, f8e4m3, f32, i32, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// DLPack device types: kDLCPU = 1, kDLCUDA = 2.
enum class DeviceKind : uint8_t { cpu = 1, cuda = 2 };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int id = 0;  // the GPU's ordinal; every CPU id is the one host
  bool operator==(const Device& o) const {
    return kind == o.kind && (kind == DeviceKind::cpu || id == o.id);
  }
};
// "cpu", "cuda:0"; a kind of neither (a cast DLPack device type, which every call refuses):
// "DLPack device type 10 (id 0)".
std::string device_name(Device device);

constexpr int kMaxDims = 4;

// A view of memory someone else owns. Strides count elements (as in DLPack).
// A default-constructed view (ndim == 0) means "absent" for optional arguments.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  bool defined() const { return ndim != 0; }  // a negative ndim is refused, not absent
  // dim in [-ndim, ndim) (negative: from the last); unchecked.
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

// A view with row-major (contiguous) strides.
TensorView make_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);
// A view with explicit element strides.
TensorView make_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides);

// "bf16[4, 64, 512] cpu" — used in error messages.
std::string describe(const TensorView& view);

}  // namespace smla
