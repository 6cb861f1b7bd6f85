// Argument checks shared by the index builders and the step machinery: each throws smla::Error
// naming the argument, what was expected and what came.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "smla/error.h"
#include "smla/tensor.h"

namespace smla::check {

[[noreturn]] void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
                       const std::string& got);

// `e` as a caller that filled its arguments under other names (the StepExecutor) says it: its
// argument, and every name its expected and got texts mention (a word of letters, digits, '_'
// and inner '.'s: "compressed.block_table", the "topk_indices" of "topk_indices[3][1] = 9"),
// as `name` renames them ("" keeps a name), then `where` after its got.
using Rename = std::function<std::string(const std::string& name)>;
Error renamed(const Error& e, const Rename& name, const std::string& where);

inline std::string num(int64_t value) { return std::to_string(value); }
std::string real(float value);  // the shortest "%g" text that reads back as `value`
// "name[i] = value", how a message names one element of an argument.
inline std::string item(const char* name, int64_t i, int64_t value) {
  return std::string(name) + "[" + num(i) + "] = " + num(value);
}
std::string shape_of(const TensorView& view);    // "[4, 128]"
std::string strides_of(const TensorView& view);  // "[128, 1]"

// A device of a kind this library runs on (DLPack kDLCPU or kDLCUDA), as a type error naming
// `name`: a view cast from another DLPack device type (kDLCUDAHost, kDLROCM, ...) would
// otherwise be taken for a CUDA device's and handed to its kernels.
void device(Device device, const std::string& name);

// A present view's own consistency: 1..kMaxDims dims, a known device kind (`device`),
// non-negative sizes, an element count and byte extent that fit in int64, and bytes that, from
// its data, lie in the address space, so that no size or address arithmetic past this check
// overflows.
void view(const TensorView& view, const std::string& name);

// A tensor the kernels read (past `view`): a contiguous last dim (vector loads on the GPU), and
// data behind it.
void memory(const TensorView& view, const std::string& name);

// Data behind a view that has elements (a null pointer with a size is refused), aligned to its
// element size.
void has_data(const TensorView& view, const std::string& name);

// The decode's scales, named `prefix` + "bmm1_scale" / "bmm2_scale": finite, and bmm1_scale
// small enough that its product with log2(e), which the CUDA kernels scale scores by in float,
// is finite too.
void scales(float bmm1_scale, float bmm2_scale, const std::string& prefix);

// A count the backends keep in int: 0..2^31 - 1.
void int32_count(int64_t value, const std::string& name);

// An output's elements are disjoint: every dim of size > 1, in order of |stride|, steps past the
// extent of the dims below it (a zero or overlapping stride would make writes race).
void disjoint(const TensorView& view, const std::string& name);

// Views that were checked by `view`: no byte of `written`'s elements is one of `other`'s. Exact
// where their spans do not meet or they interleave in one buffer (every element's bytes at the
// same residues modulo the gcd of their strides: columns of one array, halves of its rows or of
// its tokens' heads); anything else that meets counts as an overlap. Absent or empty views are
// apart from all.
void apart(const TensorView& written, const char* written_name, const TensorView& other,
           const char* other_name);

// Outputs of one call (or buffers it writes) must not overlap each other or its inputs: threads
// and CTAs would race on them. Each of `outputs` apart from those after it and from `inputs`.
struct Named {
  const TensorView& view;
  const char* name;
};
void all_apart(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs);

// A view and its name in messages: `name`, or `name[index]suffix` where index >= 0.
struct NamedView {
  const TensorView* view;
  const char* name;
  int64_t index = -1;
  const char* suffix = "";
  std::string str() const;
};
// all_apart over any number of views (a whole step's): sorted by their lowest byte, so that only
// views whose byte ranges meet are compared (exactly, by `apart`).
void all_apart(std::span<const NamedView> outputs, std::span<const NamedView> inputs);
// Each present view checked by `view`, a refusal naming it (str()): what all_apart and
// ReadViews take (a view's extent past int64 has no byte range).
void views(std::span<const NamedView> named);

// Views that outputs given one at a time must stay apart from, as all_apart would keep them:
// checked (`views`) and their byte ranges found once, so an output costs a pass over the ranges.
// The views must outlive it.
class ReadViews {
 public:
  explicit ReadViews(std::span<const NamedView> reads);
  void apart_from(const TensorView& out, const char* name) const;

 private:
  struct Entry {
    intptr_t low, high;
    NamedView named;
  };
  std::vector<Entry> entries_;
};

// A present, consistent (`view`) tensor of `dtype` on `device` whose sizes match `shape` (-1 =
// any size), with data behind it; `expected` describes the shape for the message.
void tensor(const TensorView& view, const char* name, DType dtype, Device device,
            std::initializer_list<int64_t> shape, const std::string& expected);

// Optional attention sinks (absent passes): [H = num_heads] f32 on `device`, contiguous.
void sinks(const TensorView& sinks, const std::string& name, int64_t num_heads, Device device);

// A step's requests, read on the host: cum_seq_lens_q (absent: one token a request) starts at 0,
// does not decrease and ends at num_tokens, and every seq_lens[b] >= its q_len (the new tokens'
// KV is written before attention; so seq_lens[b] >= 0 too). Then each request's q_len goes to
// `more`, for the caller's own rules.
void step_requests(const TensorView& seq_lens, const TensorView& cum_seq_lens_q,
                   int64_t num_requests, int64_t num_tokens,
                   const std::function<void(int64_t request, int64_t q_len)>& more = {});

// Element i of a 1-D i32 view / element (i, j) of a 2-D one (host memory).
inline int32_t at(const TensorView& v, int64_t i) {
  return v.ptr<const int32_t>()[i * v.strides[0]];
}
inline int32_t at(const TensorView& v, int64_t i, int64_t j) {
  return v.ptr<const int32_t>()[i * v.strides[0] + j * v.strides[1]];
}

}  // namespace smla::check
