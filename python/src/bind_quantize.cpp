// The quantizers: bf16 KV rows into a pool of any layout (include/smla/quantize.h).
#include <cstdint>

#include "bindings.h"
#include "smla/quantize.h"
#include "tensor_arg.h"

namespace smla::py {

void bind_quantize(nb::module_& m) {
  m.def(
      "quantize_kv",
      [](nb::handle rows, nb::handle slots, nb::handle pool, float kv_scale, uintptr_t stream) {
        const TensorView r = take(rows), s = take(slots), p = take(pool);
        nb::gil_scoped_release release;
        quantize_kv(r, s, p, kv_scale, reinterpret_cast<void*>(stream));
      },
      nb::arg("rows").none(), nb::arg("slots").none(), nb::arg("pool").none(), nb::arg("kv_scale"),
      nb::arg("stream"));
}

}  // namespace smla::py
