// smla::Error -> a Python exception of the class its kind names, message unchanged (it names
// the argument), with the parts as attributes: argument, expected, got.
#include "bindings.h"
#include "smla/error.h"

namespace smla::py {
namespace {

PyObject* exception_type(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::type: return PyExc_TypeError;
    case ErrorKind::value: return PyExc_ValueError;
    // Valid input this build or device cannot run: not the caller's mistake, so not a
    // ValueError; NotImplementedError is a RuntimeError, as engines that fall back expect.
    case ErrorKind::unsupported: return PyExc_NotImplementedError;
    case ErrorKind::runtime: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

void raise(const Error& e) {
  PyObject* type = exception_type(e.kind());
  nb::object exc = nb::steal(PyObject_CallOneArg(type, nb::str(e.what()).ptr()));
  if (!exc.is_valid()) return;  // the call set its own error
  exc.attr("argument") = nb::str(e.argument().c_str());
  exc.attr("expected") = nb::str(e.expected().c_str());
  exc.attr("got") = nb::str(e.got().c_str());
  PyErr_SetObject(type, exc.ptr());
}

}  // namespace

void bind_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(e);
    }
  });
}

}  // namespace smla::py
