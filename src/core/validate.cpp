// Argument checks of the decode op (SPEC §2). Dtypes, devices, shapes and strides are checked
// on every device. The values of cum_seq_lens_q, seq_lens and sparse_topk_lens are checked only
// for CPU tensors: device-resident data cannot be read without a host synchronisation (the
// launch must stay capturable), so on CUDA they are not checked and the kernel masks instead.
#include <string>

#include "core/check.h"
#include "core/problem.h"
#include "smla/error.h"
#include "smla/index.h"

namespace smla {
namespace {

using check::fail;
using check::item;
using check::num;
using check::shape_of;

void require_defined(const TensorView& v, const char* name, const char* what) {
  if (!v.defined()) fail(ErrorKind::value, name, what, "absent");
  check::view(v, name);
}

void check_device(const TensorView& v, const char* name, Device want) {
  if (!(v.device == want))
    fail(ErrorKind::type, name, device_name(want) + " (the device of the call)",
         device_name(v.device));
}

// A tensor argument of fixed dtype on the query's device.
void check_tensor(const TensorView& v, const char* name, DType dtype, Device device,
                  std::initializer_list<int64_t> shape, const std::string& expected) {
  check::tensor(v, name, dtype, device, shape, expected);
  check::memory(v, name);
}

// A scratch buffer (workspace, kv_counters): the kernel uses its bytes from `data` on, so they
// must be the view's own (contiguous) and there.
void check_scratch(const TensorView& v, const char* name) {
  if (v.defined() && !v.is_contiguous())
    fail(ErrorKind::value, name, "a contiguous buffer", shape_of(v) + " with strides " +
                                                          check::strides_of(v));
  if (v.defined()) check::has_data(v, name);
}

// Values of host-resident index arguments (see the file comment for device data).
void check_host_values(const DecodeArgs& a, const DecodeProblem& p) {
  check::step_requests(a.seq_lens, a.cum_seq_lens_q, p.num_requests, p.num_tokens,
                       [&](int64_t b, int64_t q_len) {
                         if (q_len > a.max_q_len)
                           fail(ErrorKind::value, "max_q_len",
                                ">= every q_len (request " + num(b) + " has q_len " +
                                    num(q_len) + ")",
                                num(a.max_q_len));
                       });
  for (int64_t t = 0; t < p.num_tokens && !p.topk_columns; ++t) {
    const int32_t len = check::at(a.sparse_topk_lens, t);
    if (len < 0 || len > p.num_columns)
      fail(ErrorKind::value, "sparse_topk_lens", "values in [0, K = " + num(p.num_columns) + "]",
           item("sparse_topk_lens", t, len));
  }
}

// A row's columns, K: the CUDA kernels round a row's length up to whole 32-column tiles in int
// arithmetic, which K up to 2^31 - 32 keeps from overflowing.
constexpr int64_t kMaxColumns = INT32_MAX - 31;

// TopkColumns: its tensors, and K = the width of the table it stands for (index.h).
void check_topk_columns(const DecodeArgs& a, DecodeProblem& p) {
  const TopkColumns& c = a.topk_columns;
  const std::string T = num(p.num_tokens), B = num(p.num_requests);
  check_tensor(c.topk_indices, "topk_columns.topk_indices", DType::i32, p.device,
               {p.num_tokens, -1}, "[T=" + T + ", top_k]");
  check_tensor(c.block_table, "topk_columns.block_table", DType::i32, p.device, {-1, -1},
               "[>= B=" + B + ", pages]");
  if (c.block_table.size(0) < p.num_requests)
    fail(ErrorKind::value, "topk_columns.block_table", "[>= B=" + B + ", pages]",
         shape_of(c.block_table));
  if (c.is_valid_token.defined())  // read through its stride: any stride
    check::tensor(c.is_valid_token, "topk_columns.is_valid_token", DType::u8, p.device,
                  {p.num_tokens}, "[T=" + T + "]");
  if (c.num_decodes < 0 || c.num_decodes > p.num_requests)
    fail(ErrorKind::value, "topk_columns.num_decodes", "0..B = " + B, num(c.num_decodes));
  if (c.compress_ratio < 1)
    fail(ErrorKind::value, "topk_columns.compress_ratio", ">= 1", num(c.compress_ratio));
  if (a.sparse_topk_lens.defined())
    fail(ErrorKind::value, "sparse_topk_lens", "absent with topk_columns (it sets the lengths)",
         shape_of(a.sparse_topk_lens));
  p.topk_columns = true;
  p.top_k = c.topk_indices.size(1);
  p.num_columns = p.top_k < INT32_MAX ? sparse_index_columns(p.window, p.top_k, 0) : p.top_k;
  if (p.num_columns > kMaxColumns)
    fail(ErrorKind::unsupported, "topk_columns.topk_indices",
         "W + top_k (rounded up to 4) <= 2^31 - 32", shape_of(c.topk_indices));
}

// TopkColumns without its top-k: the op reads the table. Any other field given says a top-k was
// meant.
void check_no_topk_columns(const TopkColumns& c) {
  const char* given = c.block_table.defined()      ? "topk_columns.block_table"
                      : c.is_valid_token.defined() ? "topk_columns.is_valid_token"
                      : c.compress_ratio != 0      ? "topk_columns.compress_ratio"
                      : c.num_decodes != 0         ? "topk_columns.num_decodes"
                                                   : nullptr;
  if (given)
    fail(ErrorKind::value, "topk_columns.topk_indices",
         std::string("[T, top_k] i32, as ") + given + " is given", "absent");
}

// Storage offsets are int32 (SPEC §4: page * span + slot): a span past that reaches no row of
// a second page, and page * span would overflow the builders' int64 arithmetic.
void check_span(const KvPool& pool, const TensorView& v, const char* name) {
  if (pool.span > INT32_MAX)
    fail(ErrorKind::unsupported, name, "span (rows a page, packing included) below 2^31",
         "span " + num(pool.span) + " of " + shape_of(v));
}

}  // namespace

KvPool make_pool(const TensorView& v, const char* name) {
  require_defined(v, name, "a KV pool [blocks, block_size, row]");
  KvPool pool;
  int64_t row = kHeadDim;
  switch (v.dtype) {
    case DType::bf16: pool.layout = KvLayout::bf16; break;
    case DType::f8e4m3: pool.layout = KvLayout::fp8_e4m3; break;
    case DType::u8:
      pool.layout = KvLayout::fp8_ds_mla;
      row = kDsMlaRecordBytes + kDsMlaScaleBytes;
      break;
    default: fail(ErrorKind::type, name, "bf16, f8e4m3 or u8 (fp8_ds_mla)", dtype_name(v.dtype));
  }
  const bool rank_ok = v.ndim == 3 || (v.ndim == 4 && v.size(2) == 1);
  if (!rank_ok || v.size(-1) != row)
    fail(ErrorKind::value, name,
         "[blocks, block_size, " + num(row) + "] or [blocks, block_size, 1, " + num(row) +
             "] for a " + dtype_name(v.dtype) + " pool",
         shape_of(v));
  check::memory(v, name);
  pool.base = static_cast<const std::byte*>(v.data);
  pool.num_blocks = v.size(0);
  pool.block_size = v.size(1);
  if (pool.block_size < 1) fail(ErrorKind::value, name, "block_size >= 1", shape_of(v));
  const int64_t elem = static_cast<int64_t>(dtype_size(v.dtype));
  // A dim of size 1 is read at index 0 alone: a stride that no layout could have there reads
  // as the packed one. DLPack exporters may rewrite such strides (PyTorch up to 2.9 to 1) or
  // keep a leftover that `.contiguous()` does not touch (a transposed view's: above the page
  // stride). A one-row page's token stride places nothing, so it counts only where it divides
  // the page stride into a span.
  const bool ds = pool.layout == KvLayout::fp8_ds_mla;
  int64_t token_stride = v.stride(1), block_stride = v.stride(0);
  const bool row_token_stride =
      pool.block_size == 1 &&
      (token_stride < row || block_stride < token_stride || block_stride % token_stride != 0);
  if (row_token_stride) token_stride = row;
  const int64_t page_unit = ds ? kDsMlaRecordBytes : token_stride;  // a page stride's multiple
  int64_t page = 0, rounded = 0;  // its least, and that plus page_unit - 1
  // The view's extent does not bound a token stride of a one-row page (nor, for fp8_ds_mla, a
  // page's 584-B rows): its page may not fit in int64, which no page stride could then hold.
  if (__builtin_mul_overflow(pool.block_size, ds ? row : token_stride, &page) ||
      (page_unit > 0 && __builtin_add_overflow(page, page_unit - 1, &rounded)))
    fail(ErrorKind::value, name, "a page of block_size rows whose size fits in int64",
         "block_size " + num(pool.block_size) + " and token stride " + num(token_stride));
  if (pool.num_blocks == 1 && token_stride >= row &&
      (block_stride < page || block_stride % page_unit != 0))
    block_stride = rounded / page_unit * page_unit;
  if (__builtin_mul_overflow(block_stride, elem, &pool.block_stride_bytes))
    fail(ErrorKind::value, name, "a page stride whose size in bytes fits in int64",
         num(block_stride) + " elements");
  if (ds) {
    // SPEC §2: offsets are plain slots and a page starts every block stride bytes, whatever
    // the view's token stride says; records are 576 B, then the page's scale records.
    if (pool.block_stride_bytes % kDsMlaRecordBytes != 0 || pool.block_stride_bytes < page)
      fail(ErrorKind::value, name,
           "a page stride that is a multiple of 576 B and >= block_size * 584 = " + num(page) +
               " B (the least such: " + num(rounded / kDsMlaRecordBytes * kDsMlaRecordBytes) +
               " B, each page padded to a multiple of 576 B)",
           num(pool.block_stride_bytes) + " B");
    // The view must cover those block_size * 584 bytes of its last page too.
    if (token_stride < row)
      fail(ErrorKind::value, name,
           "a token stride >= 584 B (each page's block_size * 584 bytes are read and written)",
           num(token_stride) + " B");
    pool.span = pool.block_size;
    pool.token_stride_bytes = kDsMlaRecordBytes;
    check_span(pool, v, name);
    return pool;
  }
  if (token_stride < row)
    fail(ErrorKind::value, name,
         "a token stride >= " + num(row) + " elements (rows must not overlap)", num(token_stride));
  if (block_stride % token_stride != 0)
    fail(ErrorKind::value, name,
         "a block stride that is a whole number of token strides (span = block stride / token "
         "stride)",
         "a non-integral span: block stride " + num(block_stride) + " / token stride " +
             num(token_stride) +
             (token_stride != v.stride(1)
                  ? " (one row: a page of one row has no token stride of its own, "
                    "and its " +
                        num(v.stride(1)) + " is not one a layout could have)"
                  : ""));
  pool.span = block_stride / token_stride;
  if (pool.span < pool.block_size)
    fail(ErrorKind::value, name,
         "span = block stride / token stride >= block_size = " + num(pool.block_size),
         "span " + num(pool.span));
  pool.token_stride_bytes = token_stride * elem;
  check_span(pool, v, name);
  return pool;
}

TensorView pool_records(const TensorView& v, const KvPool& pool) {
  if (pool.layout != KvLayout::fp8_ds_mla) return {};
  return make_view(v.data, DType::u8, v.device,
                   {pool.num_blocks, pool.block_size * (kDsMlaRecordBytes + kDsMlaScaleBytes)},
                   {pool.block_stride_bytes, 1});
}

DecodeProblem validate_decode(const DecodeArgs& a) {
  DecodeProblem p;
  const TensorView& q = a.query;
  require_defined(q, "query", "a [T, H, 512] tensor");
  if (q.dtype != DType::bf16 && q.dtype != DType::f8e4m3)
    fail(ErrorKind::type, "query", "bf16 or f8e4m3", dtype_name(q.dtype));
  if (q.ndim != 3 || q.size(2) != kHeadDim)
    fail(ErrorKind::value, "query", "[T, H, 512] (D = 448 NoPE + 64 RoPE)", shape_of(q));
  if (q.size(1) < 1) fail(ErrorKind::value, "query", "[T, H, 512] with H >= 1", shape_of(q));
  if (q.size(1) > kMaxHeads)
    fail(ErrorKind::unsupported, "query", "[T, H, 512] with H <= 128", shape_of(q));
  check::memory(q, "query");
  if (q.size(0) > INT32_MAX)
    fail(ErrorKind::unsupported, "query", "[T, H, 512] with T < 2^31", shape_of(q));
  p.num_tokens = q.size(0);
  p.num_heads = static_cast<int>(q.size(1));
  p.query_dtype = q.dtype;
  p.device = q.device;
  const std::string T = num(p.num_tokens), H = num(p.num_heads);

  p.swa = make_pool(a.swa_kv_cache, "swa_kv_cache");
  check_device(a.swa_kv_cache, "swa_kv_cache", p.device);
  p.layout = p.swa.layout;
  p.compressed = p.swa;
  if (a.compressed_kv_cache.defined()) {
    if (a.compressed_kv_cache.dtype != a.swa_kv_cache.dtype)
      fail(ErrorKind::type, "compressed_kv_cache",
           std::string(dtype_name(a.swa_kv_cache.dtype)) + " (the layout of swa_kv_cache)",
           dtype_name(a.compressed_kv_cache.dtype));
    p.compressed = make_pool(a.compressed_kv_cache, "compressed_kv_cache");
    check_device(a.compressed_kv_cache, "compressed_kv_cache", p.device);
  }
  if (q.dtype == DType::f8e4m3 && p.layout != KvLayout::fp8_e4m3)
    fail(ErrorKind::type, "query",
         std::string("bf16 (an f8e4m3 query needs an f8e4m3 cache, not ") +
             kv_layout_name(p.layout) + ")",
         "f8e4m3");

  if (a.window < 1) fail(ErrorKind::value, "window", ">= 1", num(a.window));
  p.window = a.window;
  const TensorView& idx = a.sparse_indices;
  check_tensor(idx, "sparse_indices", DType::i32, p.device, {p.num_tokens, -1}, "[T=" + T + ", K]");
  p.num_columns = idx.size(1);
  if (p.num_columns > kMaxColumns)
    fail(ErrorKind::unsupported, "sparse_indices", "[T=" + T + ", K] with K <= 2^31 - 32",
         shape_of(idx));
  if (p.num_columns < a.window)
    fail(ErrorKind::value, "sparse_indices", "[T=" + T + ", K] with K >= window = " + num(a.window),
         shape_of(idx));
  // K = W + P, P a multiple of 4 (SPEC §1), or a DSpark width (a multiple of 64): what
  // sparse_index_columns gives for any W.
  if (p.num_columns % 4 != 0 && (p.num_columns - a.window) % 4 != 0)
    fail(ErrorKind::value, "sparse_indices",
         "[T=" + T + ", K] with K or K - window (window = " + num(a.window) +
             ") a multiple of 4",
         shape_of(idx));
  const bool topk = a.topk_columns.topk_indices.defined();
  if (!topk) {
    check_no_topk_columns(a.topk_columns);
    check_tensor(a.sparse_topk_lens, "sparse_topk_lens", DType::i32, p.device, {p.num_tokens},
                 "[T=" + T + "]");
  }

  check_tensor(a.seq_lens, "seq_lens", DType::i32, p.device, {-1}, "[B]");
  p.num_requests = a.seq_lens.size(0);
  if (p.num_requests > INT32_MAX - 1)
    fail(ErrorKind::unsupported, "seq_lens", "[B] with B < 2^31 - 1", shape_of(a.seq_lens));
  if (p.num_requests == 0 && p.num_tokens > 0)
    fail(ErrorKind::value, "seq_lens", "[B >= 1] (the T=" + T + " tokens belong to requests)",
         shape_of(a.seq_lens));
  if (a.cum_seq_lens_q.defined()) {
    check_tensor(a.cum_seq_lens_q, "cum_seq_lens_q", DType::i32, p.device, {p.num_requests + 1},
                 "[B+1=" + num(p.num_requests + 1) + "] (B = seq_lens.size(0))");
  } else if (p.num_requests != p.num_tokens) {
    fail(ErrorKind::value, "seq_lens",
         "[B=T=" + T + "] (cum_seq_lens_q absent: one token per request)", shape_of(a.seq_lens));
  }
  if (topk) check_topk_columns(a, p);
  if (a.max_q_len < 1) fail(ErrorKind::value, "max_q_len", ">= 1", num(a.max_q_len));

  check::sinks(a.sinks, "sinks", p.num_heads, p.device);
  check::scales(a.bmm1_scale, a.bmm2_scale, "");

  check_tensor(a.out, "out", DType::bf16, p.device, {p.num_tokens, -1, kHeadDim},
               "[T=" + T + ", H_out, 512]");
  if (a.out.size(1) < p.num_heads)
    fail(ErrorKind::value, "out", "[T=" + T + ", H_out, 512] with H_out >= H = " + H,
         shape_of(a.out));
  if (a.out.size(1) > INT32_MAX)
    fail(ErrorKind::unsupported, "out", "[T=" + T + ", H_out, 512] with H_out < 2^31",
         shape_of(a.out));
  check::disjoint(a.out, "out");
  p.out_heads = static_cast<int>(a.out.size(1));
  if (a.lse.defined()) {
    check_tensor(a.lse, "lse", DType::f32, p.device, {p.num_tokens, p.num_heads},
                 "[T=" + T + ", H=" + H + "]");
    check::disjoint(a.lse, "lse");
  }
  // Their sizes are the CUDA backend's to check: only it knows what a launch needs.
  if (a.workspace.defined()) {
    check::view(a.workspace, "workspace");
    if (a.workspace.dtype != DType::u8)
      fail(ErrorKind::type, "workspace", "u8", dtype_name(a.workspace.dtype));
    check_device(a.workspace, "workspace", p.device);
  }
  if (a.kv_counters.defined()) {
    check::view(a.kv_counters, "kv_counters");
    if (a.kv_counters.dtype != DType::i32 && a.kv_counters.dtype != DType::u8)
      fail(ErrorKind::type, "kv_counters", "i32 or u8", dtype_name(a.kv_counters.dtype));
    check_device(a.kv_counters, "kv_counters", p.device);
  }
  check_scratch(a.workspace, "workspace");
  check_scratch(a.kv_counters, "kv_counters");
  const TensorView ignored{};  // without TopkColumns its views are not read (nor checked)
  const TopkColumns& columns = a.topk_columns;
  const TensorView swa_records = pool_records(a.swa_kv_cache, p.swa);
  const TensorView compressed_records =
      a.compressed_kv_cache.defined() ? pool_records(a.compressed_kv_cache, p.compressed) : ignored;
  check::all_apart({{a.out, "out"},
                    {a.lse, "lse"},
                    {a.workspace, "workspace"},
                    {a.kv_counters, "kv_counters"}},
                   {{a.query, "query"},
                    {a.swa_kv_cache, "swa_kv_cache"},
                    {a.compressed_kv_cache, "compressed_kv_cache"},
                    {swa_records, "swa_kv_cache"},
                    {compressed_records, "compressed_kv_cache"},
                    {a.sparse_indices, "sparse_indices"},
                    {a.sparse_topk_lens, "sparse_topk_lens"},
                    {p.topk_columns ? columns.topk_indices : ignored, "topk_columns.topk_indices"},
                    {p.topk_columns ? columns.block_table : ignored, "topk_columns.block_table"},
                    {p.topk_columns ? columns.is_valid_token : ignored,
                     "topk_columns.is_valid_token"},
                    {a.seq_lens, "seq_lens"},
                    {a.cum_seq_lens_q, "cum_seq_lens_q"},
                    {a.sinks, "sinks"}});

  if (p.device.kind == DeviceKind::cpu) check_host_values(a, p);
  return p;
}

}  // namespace smla
