// The extension module `smla._smla`. The Python package (python/smla) is its public face: it
// turns arrays into `_smla.Tensor`s, finds the caller's stream and fills in defaults.
#include "bindings.h"

NB_MODULE(_smla, m) {
  m.doc() = "smla: sparse MLA decode for DeepSeek-V4 (C++ extension; use the smla package)";
#if SMLA_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif
  smla::py::bind_errors(m);
  smla::py::bind_tensor(m);
  smla::py::bind_decode(m);
  smla::py::bind_index(m);
  smla::py::bind_model(m);
  smla::py::bind_tables(m);
  smla::py::bind_executor(m);
  smla::py::bind_quantize(m);
}
