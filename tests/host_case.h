// A decode call held in host memory: each tensor as bytes plus shape and strides, so a test can
// run it on the CPU as is or copy every tensor to a device and build the same call there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "smla/decode.h"

namespace smla::test {

struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape, strides;  // element strides; empty shape = absent
  std::vector<std::byte> bytes;         // every element the strides address

  // Row-major strides when `strides` is empty.
  static HostTensor make(DType dtype, std::vector<int64_t> shape,
                         std::vector<int64_t> strides = {}) {
    HostTensor t;
    t.dtype = dtype;
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
    }
    int64_t last = 0;
    bool empty = false;
    for (size_t d = 0; d < shape.size(); ++d) {
      last += (shape[d] - 1) * strides[d];
      empty = empty || shape[d] == 0;
    }
    t.shape = std::move(shape);
    t.strides = std::move(strides);
    t.bytes.resize(empty ? 0 : (last + 1) * dtype_size(dtype));
    return t;
  }

  bool defined() const { return !shape.empty(); }
  int64_t size(int d) const { return shape[d]; }
  int64_t stride(int d) const { return strides[d]; }

  // A T at byte `offset` / element `index` (in units of T), through memcpy.
  template <class T>
  T load(int64_t offset) const {
    T value;
    std::memcpy(&value, bytes.data() + offset, sizeof(T));
    return value;
  }
  template <class T>
  void store(int64_t offset, T value) {
    std::memcpy(bytes.data() + offset, &value, sizeof(T));
  }
  template <class T>
  T get(int64_t index) const {
    return load<T>(index * sizeof(T));
  }
  template <class T>
  void set(int64_t index, T value) {
    store<T>(index * sizeof(T), value);
  }

  TensorView view(void* data, Device device) const {
    TensorView v;
    if (!defined()) return v;
    v.data = data;
    v.dtype = dtype;
    v.device = device;
    v.ndim = static_cast<int>(shape.size());
    for (int d = 0; d < v.ndim; ++d) v.shape[d] = shape[d], v.strides[d] = strides[d];
    return v;
  }
};

struct DecodeCase {
  HostTensor query, swa_kv_cache, compressed_kv_cache, sparse_indices, sparse_topk_lens, seq_lens,
      cum_seq_lens_q, sinks, out, lse;
  int max_q_len = 1;
  int window = kWindow;
  float bmm1_scale = 0.f, bmm2_scale = 1.f;
  uint64_t seed = 0;
  std::string summary;  // what the generator chose; printed with every failure

  // fn(name, tensor) for every present tensor, e.g. to copy each one to a device.
  template <class Fn>
  void for_each_tensor(Fn&& fn) {
    for (const Member& m : members())
      if ((this->*m.host).defined()) fn(m.name, this->*m.host);
  }

  // The call over `data(tensor)` on `device`; the default is the case's own host bytes.
  DecodeArgs args(Device device, const std::function<void*(const HostTensor&)>& data) const {
    DecodeArgs a;
    for (const Member& m : members()) {
      const HostTensor& t = this->*m.host;
      if (t.defined()) a.*m.arg = t.view(data(t), device);
    }
    a.max_q_len = max_q_len;
    a.window = window;
    a.bmm1_scale = bmm1_scale;
    a.bmm2_scale = bmm2_scale;
    return a;
  }
  DecodeArgs args() {
    return args(Device{}, [](const HostTensor& t) {
      return static_cast<void*>(const_cast<std::byte*>(t.bytes.data()));
    });
  }

  struct Member {
    const char* name;
    HostTensor DecodeCase::*host;
    TensorView DecodeArgs::*arg;
  };
  static const std::vector<Member>& members() {
    static const std::vector<Member> list = {
        {"query", &DecodeCase::query, &DecodeArgs::query},
        {"swa_kv_cache", &DecodeCase::swa_kv_cache, &DecodeArgs::swa_kv_cache},
        {"compressed_kv_cache", &DecodeCase::compressed_kv_cache, &DecodeArgs::compressed_kv_cache},
        {"sparse_indices", &DecodeCase::sparse_indices, &DecodeArgs::sparse_indices},
        {"sparse_topk_lens", &DecodeCase::sparse_topk_lens, &DecodeArgs::sparse_topk_lens},
        {"seq_lens", &DecodeCase::seq_lens, &DecodeArgs::seq_lens},
        {"cum_seq_lens_q", &DecodeCase::cum_seq_lens_q, &DecodeArgs::cum_seq_lens_q},
        {"sinks", &DecodeCase::sinks, &DecodeArgs::sinks},
        {"out", &DecodeCase::out, &DecodeArgs::out},
        {"lse", &DecodeCase::lse, &DecodeArgs::lse}};
    return list;
  }
};

// NaN in every output element, so that anything the op fails to write shows up.
inline void poison_outputs(DecodeCase& c) {
  for (size_t i = 0; i < c.out.bytes.size() / 2; ++i) c.out.set<uint16_t>(i, 0x7fc0);
  for (size_t i = 0; i < c.lse.bytes.size() / 4; ++i) c.lse.set<uint32_t>(i, 0x7fc00000u);
}

}  // namespace smla::test
