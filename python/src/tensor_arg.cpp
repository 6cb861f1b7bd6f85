#include "tensor_arg.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "smla/error.h"

namespace smla::py {
namespace {

using Code = nb::dlpack::dtype_code;

std::string dlpack_name(nb::dlpack::dtype d) {
  std::string base;
  switch (static_cast<Code>(d.code)) {
    case Code::Int: base = "int"; break;
    case Code::UInt: base = "uint"; break;
    case Code::Float: base = "float"; break;
    case Code::Bfloat: base = "bfloat"; break;
    case Code::Bool: return "bool";
    case Code::Complex: base = "complex"; break;
    default: return "DLPack type code " + std::to_string(d.code) + "/" + std::to_string(d.bits);
  }
  return base + std::to_string(d.bits) + (d.lanes != 1 ? "x" + std::to_string(d.lanes) : "");
}

// For the dtypes engines hold indices, masks, scales and rows in, the conversion to what the
// argument takes (`takes`: its dtypes; empty: not known, guessed from the dtype alone). Arrays
// are never converted here: a copy per call would hide its cost.
std::string conversion_hint(nb::dlpack::dtype d, const std::vector<DType>& takes) {
  if (d.lanes != 1) return "";
  const auto code = static_cast<Code>(d.code);
  const auto takes_one = [&](DType t) { return std::ranges::find(takes, t) != takes.end(); };
  const bool integer = code == Code::Int || code == Code::UInt || code == Code::Bool;
  const bool floating = code == Code::Float;
  const std::string to_int32 =
      ": indices, lengths and offsets are int32 (.to(torch.int32) or .astype(numpy.int32))";
  const std::string to_float32 = ": sinks and lse are float32 (.float() or .astype(numpy.float32))";
  if (takes.empty()) {
    if ((code == Code::Int && d.bits != 32) || (code == Code::UInt && d.bits >= 32))
      return to_int32;
    if (code == Code::Float && d.bits != 32) return to_float32 + ", rows bf16";
    return "";
  }
  // kv_counters (u8 or i32): a buffer, whose bytes are what matters, not int32 indices.
  if (integer && takes_one(DType::u8) && takes_one(DType::i32))
    return ": counters are a u8 or i32 buffer (its bytes: .view(torch.uint8) or "
           ".view(numpy.uint8))";
  if (integer && takes_one(DType::i32)) return to_int32;
  if (integer && takes_one(DType::u8) && d.bits == 8)  // the same bytes: a view, no copy
    return std::string(takes.size() == 1 ? ": flags and buffers are u8"
                                         : ": an fp8_ds_mla pool is u8") +
           " (.view(torch.uint8) or .view(numpy.uint8))";
  if (integer && takes.size() == 1 && takes_one(DType::u8))
    return ": flags are u8 (.to(torch.uint8) or .astype(numpy.uint8)), buffers their bytes "
           "(.view(torch.uint8) or .view(numpy.uint8))";
  if (floating && takes_one(DType::f32)) return to_float32;
  if (floating && takes_one(DType::bf16))
    return ": rows are bf16 (.to(torch.bfloat16) or .astype(ml_dtypes.bfloat16))";
  return "";
}

// What an argument that takes `takes` expects of its elements, said when another type came.
std::string expected_elements(const std::vector<DType>& takes) {
  if (takes.empty())
    return "elements of a type smla reads, those of bf16, f8e4m3 (float8_e4m3fn), f32, i32 "
           "and u8 that this argument takes (a uint16/uint8 array holding bf16/fp8 bits: "
           "smla.with_dtype(array, 'bf16'/'f8e4m3'))";
  std::string names;
  for (size_t i = 0; i < takes.size(); ++i) {
    names += i == 0 ? "" : i + 1 == takes.size() ? " or " : ", ";
    names += takes[i] == DType::f8e4m3 ? "f8e4m3 (float8_e4m3fn)" : dtype_name(takes[i]);
  }
  const bool bf16 = std::ranges::find(takes, DType::bf16) != takes.end();
  const bool fp8 = std::ranges::find(takes, DType::f8e4m3) != takes.end();
  const std::string bits = bf16 && fp8 ? " (a uint16/uint8 array holding bf16/fp8 bits: "
                                         "smla.with_dtype(array, 'bf16'/'f8e4m3'))"
                           : bf16      ? " (a uint16 array holding bf16 bits: "
                                         "smla.with_dtype(array, 'bf16'))"
                           : fp8       ? " (a uint8 array holding fp8 bits: "
                                         "smla.with_dtype(array, 'f8e4m3'))"
                                       : "";
  return names + " elements" + bits;
}

// str(object) as UTF-8 for an error's text: a character UTF-8 cannot hold (a lone surrogate) is
// escaped, where c_str() would give null (and std::string refuse it, losing the argument's name).
// An object whose str() raises is "?": the error being made is the one to raise.
std::string text_of(nb::handle object) {
  const nb::object s = nb::steal(PyObject_Str(object.ptr()));
  nb::object bytes = nb::steal(
      s.is_valid() ? PyUnicode_AsEncodedString(s.ptr(), "utf-8", "backslashreplace") : nullptr);
  if (!bytes.is_valid()) {
    PyErr_Clear();
    return "?";
  }
  return {PyBytes_AS_STRING(bytes.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr()))};
}

// The smla dtype a DLPack dtype is, if any.
std::optional<DType> native(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  switch (static_cast<Code>(d.code)) {
    case Code::Bfloat: if (d.bits == 16) return DType::bf16; break;
    case Code::Float8_E4M3FN: if (d.bits == 8) return DType::f8e4m3; break;
    case Code::Float: if (d.bits == 32) return DType::f32; break;
    case Code::Int: if (d.bits == 32) return DType::i32; break;
    case Code::UInt: if (d.bits == 8) return DType::u8; break;
    default: break;
  }
  return std::nullopt;
}

// The dtypes named in `takes` ("bf16,f8e4m3"), parsed only for an error's message.
std::vector<DType> dtypes_of(const std::string& takes) {
  std::vector<DType> dtypes;
  for (size_t start = 0; start < takes.size();) {
    const size_t end = std::min(takes.find(',', start), takes.size());
    dtypes.push_back(parse_dtype(takes.substr(start, end - start), "takes"));
    start = end + 1;
  }
  return dtypes;
}

// Whether `takes` ("bf16,f8e4m3") names `t`; an empty one names every dtype (not known).
bool takes_dtype(std::string_view takes, DType t) {
  if (takes.empty()) return true;
  for (size_t start = 0; start <= takes.size();) {
    const size_t end = std::min(takes.find(',', start), takes.size());
    if (takes.substr(start, end - start) == dtype_name(t)) return true;
    start = end + 1;
  }
  return false;
}

// `takes`: the dtypes the argument accepts (Tensor's); `holds`: the dtype of the caller's array
// where the import sees its raw bits (an ml_dtypes or torch fp8 array viewed as integers),
// named in errors in place of the view's.
template <class Array>
TensorView view_of(const Array& a, const std::string& name, const std::optional<std::string>& dtype,
                   const std::string& takes, const std::optional<std::string>& holds) {
  TensorView v;
  const nb::dlpack::dtype d = a.dtype();
  if (dtype) {
    // A reinterpretation: only the element size has to agree (a uint16 array read as bf16).
    v.dtype = parse_dtype(*dtype, name);
    if (d.lanes != 1 || d.bits != dtype_size(v.dtype) * 8)
      throw Error(ErrorKind::type, name,
                  std::to_string(dtype_size(v.dtype) * 8) + "-bit elements to read as " + *dtype,
                  holds.value_or(dlpack_name(d)));
  } else if (const auto t = native(d); t && takes_dtype(takes, *t)) {
    v.dtype = *t;
  } else {  // not an smla dtype, or one the argument does not take: named with the conversion
    const std::vector<DType> accepted = dtypes_of(takes);
    throw Error(ErrorKind::type, name, expected_elements(accepted),
                holds.value_or(dlpack_name(d)) + conversion_hint(d, accepted));
  }
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: v.device = {DeviceKind::cpu, 0}; break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      v.device = {DeviceKind::cuda, static_cast<int>(a.device_id())};
      break;
    default:
      throw Error(ErrorKind::type, name, "an array on the CPU or a CUDA device",
                  "DLPack device type " + std::to_string(a.device_type()));
  }
  if (a.ndim() < 1 || a.ndim() > kMaxDims)
    throw Error(ErrorKind::value, name, "1.." + std::to_string(kMaxDims) + " dims",
                std::to_string(a.ndim()) + " dims");
  v.ndim = static_cast<int>(a.ndim());
  bool empty = false;
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = a.stride(i);  // nanobind counts strides in elements, as smla does
    empty = empty || v.shape[i] == 0;
  }
  // An empty array may come with zero strides (NumPy 2): row-major ones in their place, so that
  // a T = 0 step passes the checks a non-empty one would; other strides stay (a padded page).
  int64_t step = 1;
  for (int i = v.ndim - 1; empty && i >= 0; --i) {
    if (v.strides[i] == 0) v.strides[i] = step;
    step = std::max<int64_t>(v.shape[i], 1) * std::abs(v.strides[i]);
  }
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  return v;
}

}  // namespace

DType parse_dtype(const std::string& name, const std::string& argument) {
  for (DType t : {DType::bf16, DType::f8e4m3, DType::f32, DType::i32, DType::u8})
    if (name == dtype_name(t)) return t;
  // A cache layout's name (the command's --kv) where its pool's dtype is asked.
  const std::string pool = name == "fp8_e4m3" || name == "fp8" ? " (an fp8_e4m3 pool is f8e4m3)"
                           : name == "fp8_ds_mla"              ? " (an fp8_ds_mla pool is u8)"
                                                               : "";
  throw Error(ErrorKind::value, argument, "a dtype name: bf16, f8e4m3, f32, i32 or u8",
              name + pool);
}

Device parse_device(const std::string& kind, int id) {
  if (kind == "cpu") return {DeviceKind::cpu, 0};
  if (kind == "cuda" && id >= 0) return {DeviceKind::cuda, id};
  throw Error(ErrorKind::value, "device", "cpu or cuda:<index>", kind + ":" + std::to_string(id));
}

Tensor::Tensor(nb::handle array, const std::string& name, std::optional<std::string> dtype,
               bool writable, const std::string& takes, std::optional<std::string> holds) {
  // A buffer exporter may leave its strides out (ctypes arrays), which the import would read:
  // a memoryview of it states them.
  nb::object source = nb::borrow(array);
  if (!nb::hasattr(array, "__dlpack__") && PyObject_CheckBuffer(array.ptr())) {
    if (PyObject* view = PyMemoryView_FromObject(array.ptr()))
      source = nb::steal(view);
    else
      PyErr_Clear();  // the import below names what came
  }
  // convert=false: an array of another dtype or order is refused, never copied.
  nb::ndarray<> rw;
  if (nb::try_cast(source, rw, false)) {
    view_ = view_of(rw, name, dtype, takes, holds);
    rw_ = std::move(rw);
    return;
  }
  nb::ndarray<nb::ro> ro;
  if (!writable && nb::try_cast(source, ro, false)) {
    view_ = view_of(ro, name, dtype, takes, holds);
    ro_ = std::move(ro);
    return;
  }
  std::string got = text_of(nb::type_name(array.type()));
  std::string expected = writable ? "a writable array (NumPy, PyTorch, or any DLPack producer)"
                                  : "an array (NumPy, PyTorch, or any DLPack producer)";
  // An array of a dtype DLPack cannot describe (float8_e5m2, big-endian, object): its dtype
  // beside the ones the argument takes.
  if (nb::hasattr(array, "dtype")) {
    got += " of dtype " + text_of(nb::getattr(array, "dtype"));
    expected += " of " + expected_elements(dtypes_of(takes));
  }
  if (writable && nb::try_cast(source, ro, false)) {
    got = "a read-only array";
  } else if (nb::hasattr(array, "__dlpack__")) {
    // The producer's own refusal, where it has one (NumPy: strides not a multiple of the
    // element size, a dtype DLPack lacks): the reason the caller can act on.
    try {
      nb::getattr(array, "__dlpack__")();
    } catch (const nb::python_error& e) {
      if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt, SystemExit: not a refusal
      got += " (its __dlpack__: " + text_of(e.value()) + ")";
    }
  }
  throw Error(ErrorKind::type, name, expected, got);
}

TensorView take(nb::handle tensor, std::vector<nb::object>* keep) {
  if (tensor.is_none()) return {};
  const TensorView view = nb::cast<const Tensor&>(tensor).view();
  if (keep) keep->push_back(nb::borrow(tensor));
  return view;
}

nb::object as_array(const TensorView& view, nb::handle owner) {
  size_t shape[kMaxDims];
  for (int i = 0; i < view.ndim; ++i) shape[i] = static_cast<size_t>(view.shape[i]);
  nb::dlpack::dtype d;
  switch (view.dtype) {
    case DType::bf16: d = {uint8_t(Code::Bfloat), 16, 1}; break;
    case DType::f8e4m3: d = {uint8_t(Code::Float8_E4M3FN), 8, 1}; break;
    case DType::f32: d = nb::dtype<float>(); break;
    case DType::i32: d = nb::dtype<int32_t>(); break;
    case DType::u8: d = nb::dtype<uint8_t>(); break;
  }
  if (view.device.kind == DeviceKind::cpu)
    return nb::ndarray<nb::numpy, nb::ro>(view.data, view.ndim, shape, owner, view.strides, d,
                                          nb::device::cpu::value, 0)
        .cast();
  return nb::ndarray<nb::pytorch>(view.data, view.ndim, shape, owner, view.strides, d,
                                  nb::device::cuda::value, view.device.id)
      .cast();
}

void bind_tensor(nb::module_& m) {
  nb::class_<Tensor>(m, "Tensor", "An array argument as smla sees it (a DLPack view; no copy).")
      .def(nb::init<nb::handle, const std::string&, std::optional<std::string>, bool,
                    const std::string&, std::optional<std::string>>(),
           nb::arg("array"), nb::arg("name"), nb::arg("dtype").none() = nb::none(),
           nb::arg("writable") = false, nb::arg("takes") = "", nb::arg("holds").none() = nb::none())
      .def_prop_ro("dtype", [](const Tensor& t) { return dtype_name(t.view().dtype); })
      .def_prop_ro("device", [](const Tensor& t) { return device_name(t.view().device); })
      .def_prop_ro("shape",
                   [](const Tensor& t) {
                     nb::list s;
                     for (int i = 0; i < t.view().ndim; ++i) s.append(t.view().shape[i]);
                     return nb::tuple(s);
                   })
      .def_prop_ro("strides",
                   [](const Tensor& t) {
                     nb::list s;
                     for (int i = 0; i < t.view().ndim; ++i) s.append(t.view().strides[i]);
                     return nb::tuple(s);
                   })
      .def("__repr__", [](const Tensor& t) { return "smla.Tensor(" + describe(t.view()) + ")"; });
}

}  // namespace smla::py
