// Array arguments: any DLPack or buffer-protocol array (NumPy, PyTorch, CuPy, JAX) seen as a
// smla::TensorView without a copy, the array held alive as long as the view is used.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>
#include <vector>

#include "smla/tensor.h"

namespace smla::py {

namespace nb = nanobind;

// `_smla.Tensor(array, name, dtype=None, writable=False, takes="", holds=None)`. `name` is the
// argument's name, so a rejected array raises the same TypeError/ValueError as the C++ checks.
// `dtype` reinterprets arrays whose element type NumPy lacks (a uint16 array as bf16, a uint8
// one as f8e4m3). `takes`: the dtypes the argument accepts, comma-separated smla names ("i32",
// "bf16,f8e4m3,u8"), which an error for another element type names with the conversion to
// them; empty: unknown. `holds`: the caller's dtype where `array` is a raw view of it (an
// ml_dtypes bfloat16 array seen as uint16), named in errors in place of the view's.
class Tensor {
 public:
  Tensor(nb::handle array, const std::string& name, std::optional<std::string> dtype, bool writable,
         const std::string& takes = "", std::optional<std::string> holds = {});
  const TensorView& view() const { return view_; }

 private:
  TensorView view_;
  // Exactly one holds the imported array: writable arrays import as rw, inputs as ro so that
  // read-only NumPy arrays are accepted too.
  std::optional<nb::ndarray<>> rw_;
  std::optional<nb::ndarray<nb::ro>> ro_;
};

// The view behind an optional `_smla.Tensor` argument (None: absent). Keeps the Python object
// in `keep` for objects that store views past the call (tables, executors).
TensorView take(nb::handle tensor, std::vector<nb::object>* keep = nullptr);

// A read-only NumPy array (CPU) or a PyTorch tensor (CUDA; torch has no read-only tensors) over
// memory `owner` keeps alive; no copy. Its memory may be shared (a table other layers read).
nb::object as_array(const TensorView& view, nb::handle owner);

// "cpu"/"cuda" and an index, as the Python layer passes devices.
Device parse_device(const std::string& kind, int id);
// smla's dtype names (bf16, f8e4m3, f32, i32, u8).
DType parse_dtype(const std::string& name, const std::string& argument);

void bind_tensor(nb::module_& m);

}  // namespace smla::py
