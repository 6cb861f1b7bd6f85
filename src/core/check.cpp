#include "core/check.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <numeric>
#include <vector>

namespace smla::check {

void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
          const std::string& got) {
  throw Error(kind, argument, expected, got);
}

static bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

static std::string renamed_text(const std::string& text, const Rename& name) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (!word_char(text[i])) {
      out += text[i++];
      continue;
    }
    size_t end = i + 1;
    while (end < text.size() &&
           (word_char(text[end]) ||
            (text[end] == '.' && end + 1 < text.size() && word_char(text[end + 1]))))
      ++end;
    const std::string word = text.substr(i, end - i), other = name(word);
    out += other.empty() ? word : other;
    i = end;
  }
  return out;
}

Error renamed(const Error& e, const Rename& name, const std::string& where) {
  return Error(e.kind(), renamed_text(e.argument(), name), renamed_text(e.expected(), name),
               renamed_text(e.got(), name) + where);
}

static std::string list_of(const int64_t* values, int ndim) {
  std::string s = "[";
  for (int d = 0; d < std::clamp(ndim, 0, kMaxDims); ++d)
    s += (d ? ", " : "") + std::to_string(values[d]);
  return s + "]";
}
std::string real(float value) {
  char text[32];
  for (int digits = 6;; ++digits) {  // 9 significant digits read back as any float
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(value));
    if (digits == 9 || std::strtof(text, nullptr) == value) return text;
  }
}

std::string shape_of(const TensorView& v) { return list_of(v.shape, v.ndim); }
std::string strides_of(const TensorView& v) { return list_of(v.strides, v.ndim); }

void device(Device d, const std::string& name) {
  if (d.kind != DeviceKind::cpu && d.kind != DeviceKind::cuda)
    fail(ErrorKind::type, name, "a cpu or cuda device (DLPack device type 1 or 2)", device_name(d));
}

void view(const TensorView& v, const std::string& name) {
  if (v.ndim < 1 || v.ndim > kMaxDims)
    fail(ErrorKind::value, name, "1.." + std::to_string(kMaxDims) + " dims",
         std::to_string(v.ndim) + " dims");
  device(v.device, name);
  if (dtype_size(v.dtype) == 0)  // a cast int, which the byte arithmetic below cannot size
    fail(ErrorKind::type, name, "a dtype of bf16, f8e4m3, f32, i32 or u8",
         "dtype code " + std::to_string(static_cast<int>(v.dtype)));
  for (int d = 0; d < v.ndim; ++d)
    if (v.shape[d] < 0) fail(ErrorKind::value, name, "non-negative sizes", shape_of(v));
  int64_t count = 1, extent = 0, below = 0, reach = 0;  // below: the bytes before data
  bool over = false;
  for (int d = 0; d < v.ndim; ++d) {
    over = over || __builtin_mul_overflow(count, v.shape[d], &count);
    if (v.shape[d] <= 1 || v.strides[d] == 0) continue;  // a size-1 dim's stride is not used
    over = over || v.strides[d] == INT64_MIN ||
           __builtin_mul_overflow(v.shape[d] - 1, std::abs(v.strides[d]), &reach) ||
           __builtin_mul_overflow(reach, int64_t(dtype_size(v.dtype)), &reach) ||
           __builtin_add_overflow(extent, reach, &extent);
    if (!over && v.strides[d] < 0) below += reach;  // at most extent: no overflow
  }
  if (over)
    fail(ErrorKind::value, name,
         "sizes and strides whose element count and byte extent fit in int64",
         shape_of(v) + " with strides " + strides_of(v));
  // An extent that fits in int64 may still not fit past data: the overlap checks' address
  // arithmetic would overflow and a backend would read or write where the view is not.
  const uintptr_t at = reinterpret_cast<uintptr_t>(v.data);
  const uintptr_t above = uintptr_t(extent - below) + (dtype_size(v.dtype) - 1);
  if (count > 0 && v.data && (uintptr_t(below) > at || above > uintptr_t(INTPTR_MAX) - at)) {
    char address[32];
    std::snprintf(address, sizeof address, "%#zx", size_t(at));
    fail(ErrorKind::value, name, "sizes and strides whose bytes from data lie in the address space",
         shape_of(v) + " with strides " + strides_of(v) + " from data at " + address);
  }
}

void memory(const TensorView& v, const std::string& name) {
  if (v.size(-1) > 1 && v.stride(-1) != 1)
    fail(ErrorKind::value, name, "a contiguous last dim (stride 1)", "stride " + num(v.stride(-1)));
  has_data(v, name);
}

void has_data(const TensorView& v, const std::string& name) {
  if (v.numel() == 0) return;
  if (v.data == nullptr) fail(ErrorKind::value, name, "data", "a null pointer");
  // Frameworks' tensors always are; a hand-made view may not be (a fault on CUDA, UB here).
  const size_t size = dtype_size(v.dtype);
  if (const size_t past = reinterpret_cast<uintptr_t>(v.data) % size; past != 0)
    fail(ErrorKind::value, name, "data aligned to its " + num(int64_t(size)) + "-byte elements",
         "an address " + num(int64_t(past)) + " bytes past a multiple of " + num(int64_t(size)));
}

void scales(float bmm1_scale, float bmm2_scale, const std::string& prefix) {
  if (!std::isfinite(bmm1_scale * std::numbers::log2e_v<float>))
    fail(ErrorKind::value, prefix + "bmm1_scale",
         "a finite float of magnitude below 2.3e38 (it has no default: D^-0.5 in V4)",
         real(bmm1_scale));
  if (!std::isfinite(bmm2_scale))
    fail(ErrorKind::value, prefix + "bmm2_scale", "a finite float", real(bmm2_scale));
}

void int32_count(int64_t value, const std::string& name) {
  if (value < 0 || value > INT32_MAX)
    fail(ErrorKind::value, name, "0..2^31 - 1", std::to_string(value));
}

void disjoint(const TensorView& v, const std::string& name) {
  int dims[kMaxDims], n = 0;  // the dims of size > 1 by |stride| (insertion: at most 4)
  for (int d = 0; d < v.ndim; ++d) {
    if (v.shape[d] < 2) continue;
    int i = n++;
    for (; i > 0 && std::abs(v.strides[dims[i - 1]]) > std::abs(v.strides[d]); --i)
      dims[i] = dims[i - 1];
    dims[i] = d;
  }
  int64_t below = 1;  // elements spanned by the dims before this one
  for (int i = 0; i < n; ++i) {
    if (std::abs(v.strides[dims[i]]) < below)
      fail(ErrorKind::value, name,
           "non-overlapping elements (an output: each stride past the dims below it)",
           shape_of(v) + " with strides " + strides_of(v));
    if (__builtin_mul_overflow(std::abs(v.strides[dims[i]]), v.shape[dims[i]], &below))
      below = INT64_MAX;
  }
}

namespace {

// A non-empty checked view's bytes: runs of `run` bytes (its innermost dims while each steps by
// the run below it, else one element) at data + sum(i_d * step_d) over the other dims of size
// > 1, `steps` in bytes.
struct Runs {
  intptr_t low, high;  // lowest and highest byte
  int64_t run;
  int64_t steps[kMaxDims];  // no allocation: a step's whole buffers are swept per call
  int num_steps;
};

Runs runs_of(const TensorView& v) {
  const int64_t elem = int64_t(dtype_size(v.dtype));
  Runs r{reinterpret_cast<intptr_t>(v.data), 0, elem, {}, 0};
  r.high = r.low;
  bool contiguous = true;  // the dims so far (innermost first) make one run
  for (int d = v.ndim - 1; d >= 0; --d) {
    if (v.shape[d] == 1) continue;  // read at index 0 alone: its stride, any int64, is not used
    const int64_t step = v.strides[d] * elem, reach = (v.shape[d] - 1) * step;
    (reach < 0 ? r.low : r.high) += reach;
    contiguous = contiguous && step == r.run;
    if (contiguous)
      r.run *= v.shape[d];
    else
      r.steps[r.num_steps++] = std::abs(step);
  }
  r.high += elem - 1;
  return r;
}

}  // namespace

void apart(const TensorView& written, const char* written_name, const TensorView& other,
           const char* other_name) {
  if (!written.defined() || !other.defined() || written.numel() == 0 || other.numel() == 0)
    return;
  const Runs w = runs_of(written), o = runs_of(other);
  if (w.high < o.low || o.high < w.low) return;
  // Interleaved in one buffer (columns of one array, halves of its rows): every run starts at
  // its view's data modulo the steps' gcd p, so runs that fit in p and start at residues apart
  // by at least their lengths never meet.
  int64_t p = 0;
  for (const Runs* r : {&w, &o})
    for (int i = 0; i < r->num_steps; ++i) p = std::gcd(p, r->steps[i]);
  if (p > 0 && w.run <= p && o.run <= p) {
    const int64_t gap = ((o.low - w.low) % p + p) % p;  // o's residue past w's
    if (gap >= w.run && p - gap >= o.run) return;
  }
  fail(ErrorKind::value, written_name, std::string("memory apart from ") + other_name,
       "an overlap with " + std::string(other_name));
}

void all_apart(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  std::vector<NamedView> out, in;
  for (const Named& n : outputs) out.push_back({&n.view, n.name});
  for (const Named& n : inputs) in.push_back({&n.view, n.name});
  all_apart(out, in);
}

std::string NamedView::str() const {
  return index < 0 ? name : std::string(name) + "[" + num(index) + "]" + suffix;
}

void all_apart(std::span<const NamedView> outputs, std::span<const NamedView> inputs) {
  struct Entry {
    intptr_t low, high;
    const NamedView* named;
    bool output;
  };
  std::vector<Entry> entries;
  for (const bool output : {true, false})
    for (const NamedView& n : output ? outputs : inputs)
      if (n.view->defined() && n.view->numel() > 0) {
        const Runs r = runs_of(*n.view);
        entries.push_back({r.low, r.high, &n, output});
      }
  // Stable: where two start together the outputs, in order, come first (a fixed message).
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.low < b.low; });
  for (size_t i = 0; i < entries.size(); ++i)
    for (size_t j = i + 1; j < entries.size() && entries[j].low <= entries[i].high; ++j) {
      const Entry *a = &entries[i], *b = &entries[j];
      if (!a->output && !b->output) continue;  // inputs may share memory
      if (!a->output) std::swap(a, b);
      apart(*a->named->view, a->named->str().c_str(), *b->named->view, b->named->str().c_str());
    }
}

void views(std::span<const NamedView> named) {
  for (const NamedView& n : named) {
    if (!n.view->defined()) continue;
    try {
      view(*n.view, std::string());
    } catch (const Error& e) {  // its texts do not name the view: formatted for a refusal only
      throw Error(e.kind(), n.str(), e.expected(), e.got());
    }
  }
}

ReadViews::ReadViews(std::span<const NamedView> reads) {
  views(reads);
  for (const NamedView& n : reads)
    if (n.view->defined() && n.view->numel() > 0) {
      const Runs r = runs_of(*n.view);
      entries_.push_back({r.low, r.high, n});
    }
}

void ReadViews::apart_from(const TensorView& out, const char* name) const {
  if (!out.defined()) return;
  view(out, name);
  if (out.numel() == 0) return;
  const Runs r = runs_of(out);
  std::vector<const Entry*> met;
  for (const Entry& e : entries_)
    if (e.low <= r.high && r.low <= e.high) met.push_back(&e);
  // The lowest first, as all_apart compares them: the refusal names the same view.
  std::stable_sort(met.begin(), met.end(),
                   [](const Entry* a, const Entry* b) { return a->low < b->low; });
  for (const Entry* e : met) apart(out, name, *e->named.view, e->named.str().c_str());
}

void step_requests(const TensorView& seq_lens, const TensorView& cum, int64_t num_requests,
                   int64_t num_tokens, const std::function<void(int64_t, int64_t)>& more) {
  const auto start = [&](int64_t b) -> int64_t { return cum.defined() ? at(cum, b) : b; };
  if (start(0) != 0)
    fail(ErrorKind::value, "cum_seq_lens_q", "cum_seq_lens_q[0] == 0",
         item("cum_seq_lens_q", 0, start(0)));
  for (int64_t b = 0; b < num_requests; ++b)
    if (start(b + 1) < start(b))
      fail(ErrorKind::value, "cum_seq_lens_q", "non-decreasing values",
           item("cum_seq_lens_q", b, start(b)) + " > " +
               item("cum_seq_lens_q", b + 1, start(b + 1)));
  if (start(num_requests) != num_tokens)
    fail(ErrorKind::value, "cum_seq_lens_q",
         "cum_seq_lens_q[B] == T = " + num(num_tokens),
         item("cum_seq_lens_q", num_requests, start(num_requests)));
  for (int64_t b = 0; b < num_requests; ++b) {
    const int64_t q_len = start(b + 1) - start(b), seq_len = at(seq_lens, b);
    if (seq_len < q_len)
      fail(ErrorKind::value, "seq_lens",
           "seq_lens[" + num(b) + "] >= q_len = " + num(q_len) +
               " (the new tokens' KV is written before attention)",
           item("seq_lens", b, seq_len));
    if (more) more(b, q_len);
  }
}

void sinks(const TensorView& v, const std::string& name, int64_t num_heads, Device device) {
  if (!v.defined()) return;
  tensor(v, name.c_str(), DType::f32, device, {num_heads}, "[H=" + num(num_heads) + "]");
  memory(v, name);
}

void tensor(const TensorView& v, const char* name, DType dtype, Device device,
            std::initializer_list<int64_t> shape, const std::string& expected) {
  if (!v.defined()) fail(ErrorKind::value, name, "a " + expected + " tensor", "absent");
  view(v, name);
  if (v.dtype != dtype) fail(ErrorKind::type, name, dtype_name(dtype), dtype_name(v.dtype));
  if (!(v.device == device))
    fail(ErrorKind::type, name, device_name(device) + " (the device of the call)",
         device_name(v.device));
  bool ok = v.ndim == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t size : shape) ok = ok && (size < 0 || v.shape[d] == size), ++d;
  if (!ok) fail(ErrorKind::value, name, expected, shape_of(v));
  has_data(v, name);
}

}  // namespace smla::check
