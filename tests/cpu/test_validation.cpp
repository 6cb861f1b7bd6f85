// Every bad decode argument gets its own smla::Error: the right kind, the DecodeArgs field name
// as argument(), and a message that says what was expected and what came.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/problem.h"
#include "error_check.h"
#include "oracle.h"
#include "seed.h"
#include "smla/decode.h"
#include "smla/error.h"
#include "smla/index.h"
#include "smla/quantize.h"
#include "smla/streams.h"

namespace smla::test {
namespace {

constexpr Device kCuda{DeviceKind::cuda, 0};

// A valid call (T = 6 tokens in B = 3 requests, H = 8, K = 192, separate bf16 pools) that each
// test breaks in one way.
class Validation : public ::testing::Test {
 protected:
  DecodeCase c = make_case(
      {.heads = 8, .q_lens = {1, 3, 2}, .sinks = SinkKind::finite, .pools = PoolSharing::separate},
      fresh_seed());
  DecodeArgs a = c.args();
  std::vector<std::byte> scratch = std::vector<std::byte>(1 << 20);  // behind hand-made views

  void SetUp() override { ASSERT_NO_THROW(validate_decode(a)) << c.summary; }

  TensorView view(DType dtype, std::initializer_list<int64_t> shape) {
    return make_view(scratch.data(), dtype, Device{}, shape);
  }
  TensorView view(DType dtype, std::initializer_list<int64_t> shape,
                  std::initializer_list<int64_t> strides) {
    return make_view(scratch.data(), dtype, Device{}, shape, strides);
  }
  // A view spanning up to 9 GiB whose data is never read, in address space reserved for it:
  // from scratch it could span the case's own buffers, an overlap the checks refuse.
  static TensorView far_view(DType dtype, std::initializer_list<int64_t> shape,
                             std::initializer_list<int64_t> strides) {
    static void* const reserved = mmap(nullptr, size_t(9) << 30, PROT_NONE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) throw std::runtime_error("no 9 GiB of address space to reserve");
    return make_view(reserved, dtype, Device{}, shape, strides);
  }
  // Scratch buffers apart from each other (and from view()'s): workspace and kv_counters.
  void set_scratch_buffers() {
    a.workspace = make_view(scratch.data() + (1 << 19), DType::u8, Device{}, {1024});
    a.kv_counters = make_view(scratch.data() + (1 << 19) + 4096, DType::i32, Device{}, {64});
  }

  // validate_decode(a) throws kind / argument, and what() quotes `expected` and `got`.
  void expect_error(ErrorKind kind, const std::string& argument, const std::string& expected,
                    const std::string& got) {
    test::expect_smla_error([&] { validate_decode(a); }, kind, argument, expected, got);
  }
};

struct Field {
  const char* name;
  TensorView DecodeArgs::*member;
};

const Field kTensorFields[] = {
    {"query", &DecodeArgs::query},
    {"swa_kv_cache", &DecodeArgs::swa_kv_cache},
    {"compressed_kv_cache", &DecodeArgs::compressed_kv_cache},
    {"sparse_indices", &DecodeArgs::sparse_indices},
    {"sparse_topk_lens", &DecodeArgs::sparse_topk_lens},
    {"seq_lens", &DecodeArgs::seq_lens},
    {"cum_seq_lens_q", &DecodeArgs::cum_seq_lens_q},
    {"sinks", &DecodeArgs::sinks},
    {"out", &DecodeArgs::out},
    {"lse", &DecodeArgs::lse},
    {"workspace", &DecodeArgs::workspace},
    {"kv_counters", &DecodeArgs::kv_counters},
};

// The tensor of `args` that kTensorFields names `name`.
TensorView& field(DecodeArgs& args, const std::string& name) {
  for (const Field& f : kTensorFields)
    if (name == f.name) return args.*f.member;
  throw std::logic_error("no DecodeArgs tensor named " + name);
}

// The shared check helpers' own bounds (core/check.h), which the calls above reach only in part.
TEST(CheckHelpers, BoundsOfCountsViewsAndOverlaps) {
  EXPECT_NO_THROW(check::int32_count(0, "n"));
  EXPECT_NO_THROW(check::int32_count(INT32_MAX, "n"));  // 0..2^31 - 1, both ends in
  EXPECT_THROW(check::int32_count(int64_t(INT32_MAX) + 1, "n"), Error);
  EXPECT_THROW(check::int32_count(-1, "n"), Error);
  std::vector<std::byte> buf(64);
  const auto f32 = [&](int64_t offset, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides) {
    return make_view(buf.data() + offset, DType::f32, Device{}, shape, strides);
  };
  EXPECT_THROW(check::view(f32(0, {-1}, {1}), "v"), Error);  // a size of -1
  // 2^64 elements: past int64 even where zero strides keep the byte extent at 0.
  EXPECT_THROW(check::view(f32(0, {int64_t(1) << 32, int64_t(1) << 32}, {0, 0}), "v"), Error);
  // Extents past int64 in bytes though not in elements, and only once the dims are summed.
  EXPECT_THROW(check::view(f32(0, {2}, {int64_t(1) << 62}), "v"), Error);
  EXPECT_THROW(check::view(f32(0, {2, 2}, {int64_t(1) << 60, int64_t(1) << 60}), "v"), Error);
  // A last dim of size 1 is read at index 0 alone: its stride may be anything.
  EXPECT_NO_THROW(check::memory(f32(0, {4, 1}, {1, 7}), "v"));
  // f32[2] at bytes 0..7: one at bytes 8..15 is apart, one at 7..14 shares its last byte.
  EXPECT_NO_THROW(check::apart(f32(0, {2}, {1}), "a", f32(8, {2}, {1}), "b"));
  EXPECT_NO_THROW(check::apart(f32(8, {2}, {1}), "b", f32(0, {2}, {1}), "a"));
  EXPECT_THROW(check::apart(f32(0, {2}, {1}), "a", f32(7, {2}, {1}), "b"), Error);
  EXPECT_THROW(check::apart(f32(7, {2}, {1}), "b", f32(0, {2}, {1}), "a"), Error);
  // Interleaved rows (u8 [4, 4], row stride 8): at byte 4 the other view fills the gaps, at
  // byte 3 it shares each row's last byte.
  const auto u8 = [&](int64_t offset) {
    return make_view(buf.data() + offset, DType::u8, Device{}, {4, 4}, {8, 1});
  };
  EXPECT_NO_THROW(check::apart(u8(0), "a", u8(4), "b"));
  EXPECT_THROW(check::apart(u8(0), "a", u8(3), "b"), Error);
  // Halves of rows that span two dims (u8 [2, 2, 4] of a [2, 4, 4] buffer: heads 0-1 and 2-3
  // of each token, as out and query sliced by heads): apart; shifted a byte, they meet.
  const auto heads = [&](int64_t offset) {
    return make_view(buf.data() + offset, DType::u8, Device{}, {2, 2, 4}, {16, 4, 1});
  };
  EXPECT_NO_THROW(check::apart(heads(0), "a", heads(8), "b"));
  EXPECT_NO_THROW(check::apart(heads(8), "b", heads(0), "a"));
  EXPECT_THROW(check::apart(heads(0), "a", heads(7), "b"), Error);
  EXPECT_THROW(check::apart(heads(1), "a", heads(8), "b"), Error);
  // disjoint's extent saturates past int64: 4 steps of 2^62 reach past every stride, so a
  // second dim of 2^62 (element [1, 0] is [0, 1]) overlaps, not a wrapped extent of 0.
  EXPECT_THROW(check::disjoint(make_view(buf.data(), DType::u8, Device{}, {4, 2},
                                         {int64_t(1) << 62, int64_t(1) << 62}),
                               "v"),
               Error);
}

TEST_F(Validation, WrongDtypeOfEachTensor) {
  struct Case {
    const char* name;
    DType wrong;
    const char* expected;
  };
  const Case cases[] = {
      {"query", DType::f32, "bf16 or f8e4m3"},
      {"swa_kv_cache", DType::i32, "bf16, f8e4m3 or u8"},
      {"sparse_indices", DType::f32, "i32"},
      {"sparse_topk_lens", DType::u8, "i32"},
      {"seq_lens", DType::f32, "i32"},
      {"cum_seq_lens_q", DType::bf16, "i32"},
      {"sinks", DType::bf16, "f32"},
      {"out", DType::f32, "bf16"},
      {"lse", DType::bf16, "f32"},
      {"workspace", DType::i32, "u8"},
      {"kv_counters", DType::f32, "i32 or u8"},
  };
  set_scratch_buffers();
  ASSERT_NO_THROW(validate_decode(a));
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    TensorView& v = field(a, k.name);
    const DType saved = v.dtype;
    v.dtype = k.wrong;
    expect_error(ErrorKind::type, k.name, k.expected, dtype_name(k.wrong));
    v.dtype = saved;
  }
}

TEST_F(Validation, PoolsOfDifferentLayouts) {
  a.compressed_kv_cache.dtype = DType::f8e4m3;
  expect_error(ErrorKind::type, "compressed_kv_cache", "bf16", "f8e4m3");
}

TEST_F(Validation, Fp8QueryNeedsPerTensorFp8Cache) {
  a.query.dtype = DType::f8e4m3;
  expect_error(ErrorKind::type, "query", "an f8e4m3 query needs an f8e4m3 cache", "f8e4m3");
  DecodeCase ds = make_case({.layout = KvLayout::fp8_ds_mla}, fresh_seed());
  a = ds.args();
  a.query.dtype = DType::f8e4m3;
  expect_error(ErrorKind::type, "query", "not fp8_ds_mla", "f8e4m3");
}

TEST_F(Validation, TensorOnAnotherDevice) {
  set_scratch_buffers();
  for (const Field& f : kTensorFields) {
    if (std::string(f.name) == "query") continue;
    SCOPED_TRACE(f.name);
    (a.*f.member).device = kCuda;
    expect_error(ErrorKind::type, f.name, "cpu", "cuda:0");
    (a.*f.member).device = Device{};
  }
  a.query.device = kCuda;  // then the first other tensor is the odd one
  expect_error(ErrorKind::type, "swa_kv_cache", "cuda:0", "cpu");
}

// A DLPack device type other than kDLCPU and kDLCUDA cast into a view (kDLCUDAHost = 3,
// kDLROCM = 10) is refused as what it is, naming the tensor: taken for a CUDA device, it would
// reach the CUDA backend (in a build with one) with memory that is not that device's.
TEST_F(Validation, DeviceOfAnotherKind) {
  for (const int type : {3, 10}) {
    const Device other{static_cast<DeviceKind>(type), 0};
    const std::string name = "DLPack device type " + std::to_string(type) + " (id 0)";
    for (const Field& f : kTensorFields) (a.*f.member).device = other;
    test::expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::type, "query",
                            "a cpu or cuda device (DLPack device type 1 or 2)", name);
    for (const Field& f : kTensorFields) (a.*f.member).device = Device{};
    a.lse.device = other;  // one tensor of them: refused by its name too
    expect_error(ErrorKind::type, "lse", "a cpu or cuda device", name);
    a.lse.device = Device{};
    test::expect_smla_error([&] { make_streams(other); }, ErrorKind::type, "device",
                            "a cpu or cuda device", name);
    test::expect_smla_error([&] { workspace_bytes(8, 64, 640, other); }, ErrorKind::type, "device",
                            "a cpu or cuda device", name);
    test::expect_smla_error([&] { max_topk_width(other); }, ErrorKind::type, "device",
                            "a cpu or cuda device", name);
    const Capability answer = query_capability(kHeadDim, DType::bf16, DType::bf16, 64, other);
    EXPECT_FALSE(answer.supported);
    EXPECT_EQ(answer.reason, "device " + name + " is neither cpu nor cuda");
  }
}

TEST_F(Validation, RequiredTensorAbsent) {
  for (const char* name :
       {"query", "swa_kv_cache", "sparse_indices", "sparse_topk_lens", "seq_lens", "out"}) {
    SCOPED_TRACE(name);
    DecodeArgs broken = a;
    field(broken, name) = TensorView{};
    std::swap(a, broken);
    expect_error(ErrorKind::value, name, "[", "absent");  // its shape
    std::swap(a, broken);
  }
}

TEST_F(Validation, NullData) {
  a.sinks.data = nullptr;
  expect_error(ErrorKind::value, "sinks", "data", "a null pointer");
}

// Data not aligned to its elements (a hand-made view: frameworks' are) is refused by name, for
// every tensor of more than one byte an element: a fault on CUDA, undefined behaviour here.
TEST_F(Validation, DataAlignedToItsElements) {
  set_scratch_buffers();
  int checked = 0;
  for (const Field& f : kTensorFields) {
    TensorView& v = a.*f.member;
    const size_t size = dtype_size(v.dtype);
    if (!v.defined() || size == 1) continue;
    SCOPED_TRACE(f.name);
    void* const saved = v.data;
    v.data = static_cast<std::byte*>(saved) + 1;
    expect_error(ErrorKind::value, f.name,
                 "data aligned to its " + std::to_string(size) + "-byte elements",
                 "an address 1 bytes past a multiple of " + std::to_string(size));
    v.data = saved;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// The scratch buffers too: on CUDA a plan that splits rows through the counters writes the
// partials and counters at their data, whatever the view's size says is there.
TEST_F(Validation, NullScratchBuffers) {
  set_scratch_buffers();
  ASSERT_NO_THROW(validate_decode(a));
  const TensorView workspace = a.workspace;
  a.workspace.data = nullptr;
  expect_error(ErrorKind::value, "workspace", "data", "a null pointer");
  a.workspace = workspace;
  a.kv_counters.data = nullptr;
  expect_error(ErrorKind::value, "kv_counters", "data", "a null pointer");
  a.kv_counters = make_view(nullptr, DType::i32, Device{}, {0});  // no bytes: nothing written
  EXPECT_NO_THROW(validate_decode(a));
}

// A view's own fields: its rank, and sizes whose element count or byte extent leave int64.
TEST_F(Validation, RankOutsideTheViewAndSizesPastInt64) {
  a.query.ndim = 50;
  expect_error(ErrorKind::value, "query", "1..4 dims", "50 dims");
  a.query.ndim = 0;  // no dims: an absent tensor (TensorView::defined), whatever its data
  expect_error(ErrorKind::value, "query", "a [T, H, 512] tensor", "absent");
  a.query = c.args().query;
  // A dtype code outside the enum (a cast int) is a type error, not a byte-arithmetic one.
  a.query.dtype = static_cast<DType>(5);
  expect_error(ErrorKind::type, "query", "a dtype of bf16, f8e4m3, f32, i32 or u8", "dtype code 5");
  a.query = c.args().query;
  // A negative rank is a bad view, not an absent one: an optional tensor read as absent would
  // go unwritten (lse) or be replaced (compressed_kv_cache by the SWA pool).
  a.sinks.ndim = -1;
  expect_error(ErrorKind::value, "sinks", "1..4 dims", "-1 dims");
  a.sinks = c.args().sinks;
  a.lse.ndim = -1;
  expect_error(ErrorKind::value, "lse", "1..4 dims", "-1 dims");
  a.lse = c.args().lse;
  a.swa_kv_cache =
      make_view(nullptr, DType::bf16, Device{}, {int64_t(1) << 46, 512, 512}, {1 << 18, 512, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "fit in int64", "[70368744177664, 512, 512]");
  a.swa_kv_cache = c.args().swa_kv_cache;
  a.sinks = view(DType::f32, {8}, {int64_t(1) << 62});
  expect_error(ErrorKind::value, "sinks", "byte extent fit in int64", "with strides");
  a.sinks = c.args().sinks;
  // Extents that fit in int64 but not past (or before) data's address: the overlap checks'
  // address arithmetic overflowed (UBSan) and the backend read far outside the view.
  const int64_t far = (INT64_MAX - 8 * 512 * 2) / 10;  // 5 token steps of 2 bytes: < 2^63
  for (const int64_t stride : {far, -far}) {
    a.query = view(DType::bf16, {6, 8, 512}, {stride, 512, 1});
    expect_error(ErrorKind::value, "query", "bytes from data lie in the address space",
                 "from data at 0x");
  }
}

// Outputs must not alias themselves: threads (or CTAs) would race on the shared elements.
TEST_F(Validation, OverlappingOutputs) {
  const TensorView out = a.out;
  a.out = view(DType::bf16, {6, out.size(1), 512}, {0, 512, 1});
  expect_error(ErrorKind::value, "out", "non-overlapping", "with strides [0, 512, 1]");
  a.out = view(DType::bf16, {6, out.size(1), 512}, {out.size(1) * 512, 256, 1});
  expect_error(ErrorKind::value, "out", "non-overlapping", "256");
  a.out = view(DType::bf16, {6, out.size(1), 512}, {out.size(1) * 512 + 64, 512, 1});
  EXPECT_NO_THROW(validate_decode(a));  // padded rows are fine
  a.out = out;
  a.lse = view(DType::f32, {6, 8}, {1, 1});
  expect_error(ErrorKind::value, "lse", "non-overlapping", "[1, 1]");
}

// Nor may they alias each other or an input: a CTA's writes would race with another's reads.
TEST_F(Validation, OutputsApartFromEachOtherAndTheInputs) {
  const TensorView out = a.out, lse = a.lse;
  ASSERT_TRUE(lse.defined());
  a.lse = make_view(out.data, DType::f32, Device{}, {lse.size(0), lse.size(1)});
  expect_error(ErrorKind::value, "out", "memory apart from lse", "an overlap with lse");
  a.lse = lse;
  a.out = make_view(a.query.data, DType::bf16, Device{}, {out.size(0), a.query.size(1), 512});
  expect_error(ErrorKind::value, "out", "memory apart from query", "an overlap with query");
  a.out = out;
  const TensorView seq_lens = a.seq_lens;
  a.seq_lens = make_view(lse.data, DType::i32, Device{}, {seq_lens.size(0)});  // inside lse
  expect_error(ErrorKind::value, "lse", "memory apart from seq_lens", "an overlap with seq_lens");
  a.seq_lens = seq_lens;
  EXPECT_NO_THROW(validate_decode(a));
  // Buffers the kernel writes count as outputs.
  set_scratch_buffers();
  const TensorView workspace = a.workspace;
  a.workspace = make_view(a.sparse_indices.data, DType::u8, Device{}, {64});
  expect_error(ErrorKind::value, "workspace", "memory apart from sparse_indices",
               "an overlap with sparse_indices");
  a.workspace = workspace;
  // Halves of one buffer's rows interleave without sharing a byte: the query's and out's.
  const int64_t T = a.query.size(0), H = a.query.size(1);
  std::vector<std::byte> both(T * H * 1024 * 2);
  a.query = make_view(both.data(), DType::bf16, Device{}, {T, H, 512}, {H * 1024, 1024, 1});
  a.out = make_view(both.data() + 1024, DType::bf16, Device{}, {T, H, 512}, {H * 1024, 1024, 1});
  EXPECT_NO_THROW(validate_decode(a));
  a.out = make_view(both.data() + 512, DType::bf16, Device{}, {T, H, 512}, {H * 1024, 1024, 1});
  expect_error(ErrorKind::value, "out", "memory apart from query", "an overlap with query");
}

// Every input is apart from lse: each small one moved into lse's memory (its bytes copied there,
// so only the overlap is wrong), and lse moved inside the compressed pool. A byte in common is
// enough: workspace's first byte on out's last.
TEST_F(Validation, LseApartFromEveryInput) {
  const size_t lse_bytes = static_cast<size_t>(a.lse.numel()) * 4;
  for (const char* name : {"sinks", "cum_seq_lens_q", "sparse_topk_lens", "seq_lens"}) {
    SCOPED_TRACE(name);
    TensorView& input = field(a, name);
    const TensorView saved = input;
    const size_t bytes = static_cast<size_t>(input.numel()) * dtype_size(input.dtype);
    ASSERT_TRUE(input.is_contiguous());
    ASSERT_LE(bytes, lse_bytes);
    std::memcpy(a.lse.data, saved.data, bytes);
    input.data = a.lse.data;
    expect_error(ErrorKind::value, "lse", std::string("memory apart from ") + name,
                 std::string("an overlap with ") + name);
    input = saved;
  }
  const TensorView lse = a.lse;
  a.lse = make_view(a.compressed_kv_cache.data, DType::f32, Device{}, {lse.size(0), lse.size(1)});
  expect_error(ErrorKind::value, "lse", "memory apart from compressed_kv_cache",
               "an overlap with compressed_kv_cache");
  a.lse = lse;
  set_scratch_buffers();
  ASSERT_NO_THROW(validate_decode(a));
  ASSERT_TRUE(a.out.is_contiguous());
  const size_t out_bytes = static_cast<size_t>(a.out.numel()) * 2;
  a.workspace =
      make_view(static_cast<std::byte*>(a.out.data) + out_bytes - 1, DType::u8, Device{}, {64});
  expect_error(ErrorKind::value, "out", "memory apart from workspace", "an overlap with workspace");
}

// An fp8_ds_mla pool is read at its pages' first block_size * 584 bytes whatever its token
// stride: an output in the gaps between a wider stride's rows (lse at byte 600 of page 0,
// inside token 1's record) would be written while those bytes are read. Either pool so, the
// other one elsewhere.
TEST_F(Validation, OutputsApartFromDsMlaRecordsBetweenTokenStrides) {
  const int64_t T = a.lse.size(0), H = a.lse.size(1);
  for (const char* name : {"swa_kv_cache", "compressed_kv_cache"}) {
    SCOPED_TRACE(name);
    const bool swa = std::string(name) == "swa_kv_cache";
    const TensorView elsewhere =
        make_view(scratch.data() + (1 << 19), DType::u8, Device{}, {2, 2, 584}, {3 * 576, 584, 1});
    const TensorView wide = view(DType::u8, {2, 2, 584}, {125 * 576, 1000, 1});
    a.swa_kv_cache = swa ? wide : elsewhere;
    a.compressed_kv_cache = swa ? elsewhere : wide;
    a.lse = make_view(scratch.data() + 600, DType::f32, Device{}, {T, H}, {250, 1});
    expect_error(ErrorKind::value, "lse", std::string("memory apart from ") + name,
                 std::string("an overlap with ") + name);
    // Past the page's 2 * 584 bytes, between the view's rows, it is apart.
    a.lse = make_view(scratch.data() + 1600, DType::f32, Device{}, {T, H}, {500, 1});
    EXPECT_NO_THROW(validate_decode(a));
  }
}

// The kernel uses a scratch buffer's bytes from its start: they must be its own.
TEST_F(Validation, ScratchBuffersContiguousAndApart) {
  set_scratch_buffers();
  ASSERT_NO_THROW(validate_decode(a));
  const TensorView counters = a.kv_counters;
  a.kv_counters = make_view(counters.data, DType::i32, Device{}, {64}, {0});
  expect_error(ErrorKind::value, "kv_counters", "contiguous", "with strides [0]");
  a.kv_counters = make_view(a.workspace.ptr<std::byte>() + 512, DType::i32, Device{}, {64});
  expect_error(ErrorKind::value, "workspace", "apart", "overlap");
  a.kv_counters = counters;
  a.workspace = make_view(scratch.data(), DType::u8, Device{}, {4, 256}, {512, 1});  // a slice
  expect_error(ErrorKind::value, "workspace", "contiguous", "with strides [512, 1]");
}

// Every CPU device id names the one host.
TEST_F(Validation, CpuDeviceIdsAreOneDevice) {
  a.swa_kv_cache.device = Device{DeviceKind::cpu, 1};
  EXPECT_NO_THROW(validate_decode(a));
}

TEST_F(Validation, QueryNotRank3) {
  a.query = view(DType::bf16, {6, 8 * 512});
  expect_error(ErrorKind::value, "query", "[T, H, 512]", "[6, 4096]");
}

TEST_F(Validation, HeadDimNot512) {
  a.query = view(DType::bf16, {6, 8, 576});
  expect_error(ErrorKind::value, "query", "[T, H, 512]", "[6, 8, 576]");
}

TEST_F(Validation, ZeroHeads) {
  a.query = view(DType::bf16, {6, 0, 512});
  expect_error(ErrorKind::value, "query", "H >= 1", "[6, 0, 512]");
}

TEST_F(Validation, MoreThan128Heads) {
  a.query = view(DType::bf16, {6, 129, 512});
  expect_error(ErrorKind::unsupported, "query", "H <= 128", "[6, 129, 512]");
}

TEST_F(Validation, OutHeadsBelowHeads) {
  a.out = view(DType::bf16, {6, 7, 512});  // one head short
  expect_error(ErrorKind::value, "out", "H_out >= H = 8", "[6, 7, 512]");
}

TEST_F(Validation, OutShape) {
  a.out = view(DType::bf16, {6, 8, 256});
  expect_error(ErrorKind::value, "out", "[T=6, H_out, 512]", "[6, 8, 256]");
  a.out = view(DType::bf16, {5, 8, 512});
  expect_error(ErrorKind::value, "out", "[T=6, H_out, 512]", "[5, 8, 512]");
}

// K = W + P with P a multiple of 4 (SPEC §1), or a DSpark width (a multiple of 64), whatever W
// is: the tables sparse_index_columns sizes for an odd window are accepted.
TEST_F(Validation, ColumnsNotAMultipleOf4) {
  a.sparse_indices = view(DType::i32, {6, 130});
  expect_error(ErrorKind::value, "sparse_indices",
               "[T=6, K] with K or K - window (window = 128) a multiple of 4", "[6, 130]");
  a.window = 6;
  a.sparse_topk_lens = view(DType::i32, {6});  // zeros: within K
  a.sparse_indices = view(DType::i32, {6, sparse_index_columns(6, 4, 0)});
  EXPECT_NO_THROW(validate_decode(a));
  a.sparse_indices = view(DType::i32, {6, sparse_index_columns(6, 0, dspark_swa_width(6, 3))});
  EXPECT_NO_THROW(validate_decode(a));
  a.sparse_indices = view(DType::i32, {6, 11});
  expect_error(ErrorKind::value, "sparse_indices",
               "[T=6, K] with K or K - window (window = 6) a multiple of 4", "[6, 11]");
}

// The CUDA kernels round a row's length up to whole 32-column tiles in int: K past 2^31 - 32
// would overflow there (only the shape is read before the refusal).
// Token indices are int in the kernels: T = 2^31 is refused by the query's shape alone.
TEST_F(Validation, TokensFromInt32) {
  a.query = view(DType::bf16, {int64_t(1) << 31, 8, 512}, {0, 512, 1});
  expect_error(ErrorKind::unsupported, "query", "[T, H, 512] with T < 2^31",
               "[2147483648, 8, 512]");
  // T = 2^31 - 1 passes to the next check (sparse_indices' [T, K]).
  a.query = view(DType::bf16, {INT32_MAX, 8, 512}, {0, 512, 1});
  expect_error(ErrorKind::value, "sparse_indices", "[T=2147483647, K]", "[6, 192]");
}

TEST_F(Validation, ColumnsPastWholeTilesOfInt) {
  a.sparse_indices = far_view(DType::i32, {6, int64_t(INT32_MAX) - 27}, {0, 1});
  expect_error(ErrorKind::unsupported, "sparse_indices", "K <= 2^31 - 32", "[6, 2147483620]");
  a.sparse_indices = far_view(DType::i32, {6, int64_t(INT32_MAX) - 31}, {0, 1});  // 2^31 - 32
  EXPECT_NO_THROW(validate_decode(a));
  // With W = 1, K = 2^31 - 31 is W + a multiple of 4, and one column too many.
  a.window = 1;
  a.sparse_indices = far_view(DType::i32, {6, int64_t(INT32_MAX) - 30}, {0, 1});
  expect_error(ErrorKind::unsupported, "sparse_indices", "K <= 2^31 - 32", "[6, 2147483617]");
}

// Request indices are int with B + 1 bounds: B = 2^31 - 1 is refused by seq_lens' shape, and
// B = 2^31 - 2 passes to the next check (cum_seq_lens_q's [B+1]).
TEST_F(Validation, RequestsBelowInt32Max) {
  a.seq_lens = far_view(DType::i32, {INT32_MAX}, {1});  // only its shape is read before the refusal
  expect_error(ErrorKind::unsupported, "seq_lens", "[B] with B < 2^31 - 1", "[2147483647]");
  a.seq_lens = far_view(DType::i32, {INT32_MAX - 1}, {1});
  expect_error(ErrorKind::value, "cum_seq_lens_q", "[B+1=2147483647]", "[4]");
}

// Output heads are int in the kernels: H_out = 2^31 is refused by out's shape, 2^31 - 1 passes
// to the next check (its stride-0 heads overlap).
TEST_F(Validation, OutHeadsFromInt32) {
  a.out = view(DType::bf16, {6, int64_t(1) << 31, 512}, {512, 0, 1});
  expect_error(ErrorKind::unsupported, "out", "[T=6, H_out, 512] with H_out < 2^31",
               "[6, 2147483648, 512]");
  a.out = view(DType::bf16, {6, INT32_MAX, 512}, {512, 0, 1});
  expect_error(ErrorKind::value, "out", "non-overlapping elements",
               "[6, 2147483647, 512] with strides [512, 0, 1]");
}

TEST_F(Validation, ColumnsBelowWindow) {
  a.window = 193;  // K = 192 = window - 1, whose P would be a multiple of 4 were it not negative
  expect_error(ErrorKind::value, "sparse_indices", "K >= window = 193", "[6, 192]");
}

TEST_F(Validation, WindowBelowOne) {
  a.window = 0;
  expect_error(ErrorKind::value, "window", ">= 1", "0");
}

TEST_F(Validation, SparseIndicesRows) {
  a.sparse_indices = view(DType::i32, {7, 192});
  expect_error(ErrorKind::value, "sparse_indices", "[T=6, K]", "[7, 192]");
}

TEST_F(Validation, TopkLensShape) {
  a.sparse_topk_lens = view(DType::i32, {6, 1});
  expect_error(ErrorKind::value, "sparse_topk_lens", "[T=6]", "[6, 1]");
}

TEST_F(Validation, LastDimNotContiguous) {
  a.query = view(DType::bf16, {6, 8, 512}, {8 * 1024, 1024, 2});
  expect_error(ErrorKind::value, "query", "contiguous last dim", "stride 2");
  a = c.args();
  a.seq_lens.strides[0] = 2;
  expect_error(ErrorKind::value, "seq_lens", "contiguous last dim", "stride 2");
  a = c.args();
  a.swa_kv_cache.strides[a.swa_kv_cache.ndim - 1] = 3;
  expect_error(ErrorKind::value, "swa_kv_cache", "contiguous last dim", "stride 3");
}

TEST_F(Validation, SinksShape) {
  a.sinks = view(DType::f32, {9});
  expect_error(ErrorKind::value, "sinks", "[H=8]", "[9]");
}

TEST_F(Validation, LseShape) {
  a.lse = view(DType::f32, {6, 16});
  expect_error(ErrorKind::value, "lse", "[T=6, H=8]", "[6, 16]");
}

TEST_F(Validation, CumSeqLensShape) {
  a.cum_seq_lens_q = view(DType::i32, {3});
  expect_error(ErrorKind::value, "cum_seq_lens_q", "[B+1=4]", "[3]");
}

// Tokens with no request (B = 0, cum_seq_lens_q = {0}) are refused by seq_lens, not read.
TEST_F(Validation, TokensWithoutRequests) {
  a.seq_lens = view(DType::i32, {0});
  a.cum_seq_lens_q = make_view(scratch.data() + 64, DType::i32, Device{}, {1});
  expect_error(ErrorKind::value, "seq_lens", "[B >= 1] (the T=6 tokens belong to requests)", "[0]");
}

TEST_F(Validation, NoCumSeqLensMeansOneTokenPerRequest) {
  a.cum_seq_lens_q = TensorView{};
  expect_error(ErrorKind::value, "seq_lens", "[B=T=6]", "[3]");
}

TEST_F(Validation, MaxQLenBelowOne) {
  a.max_q_len = 0;
  expect_error(ErrorKind::value, "max_q_len", ">= 1", "0");
}

TEST_F(Validation, NonFiniteScales) {
  a.bmm1_scale = DecodeArgs{}.bmm1_scale;  // never set: no default scale to fall back on
  expect_error(ErrorKind::value, "bmm1_scale", "finite", "nan");
  // Finite, but not once the CUDA kernels multiply it by log2(e) in float (inf: NaN scores).
  a.bmm1_scale = -3e38f;
  expect_error(ErrorKind::value, "bmm1_scale", "below 2.3e38", "-3e+38");
  a.bmm1_scale = 2.3e38f;  // 2.3e38 * log2(e) = 3.32e38, below FLT_MAX's 3.40e38
  EXPECT_NO_THROW(validate_decode(a));
  a.bmm1_scale = 1.f;
  a.bmm2_scale = std::numeric_limits<float>::infinity();
  expect_error(ErrorKind::value, "bmm2_scale", "finite", "inf");
}

TEST_F(Validation, PoolRank) {
  a.swa_kv_cache = view(DType::bf16, {64, 512});
  expect_error(ErrorKind::value, "swa_kv_cache", "[blocks, block_size, 512]", "[64, 512]");
  a.swa_kv_cache = view(DType::bf16, {4, 16, 2, 512});
  expect_error(ErrorKind::value, "swa_kv_cache", "[blocks, block_size, 1, 512]", "[4, 16, 2, 512]");
}

TEST_F(Validation, PoolRowSize) {
  a.swa_kv_cache = view(DType::bf16, {4, 16, 584});
  expect_error(ErrorKind::value, "swa_kv_cache", "[blocks, block_size, 512]", "[4, 16, 584]");
  a = c.args();
  a.compressed_kv_cache = TensorView{};
  a.swa_kv_cache = view(DType::u8, {4, 16, 576}, {16 * 576, 576, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "[blocks, block_size, 584]", "[4, 16, 576]");
}

TEST_F(Validation, PoolBlockSizeZero) {
  a.swa_kv_cache = view(DType::bf16, {4, 0, 512});
  expect_error(ErrorKind::value, "swa_kv_cache", "block_size >= 1", "[4, 0, 512]");
}

TEST_F(Validation, NonIntegralSpan) {
  a.swa_kv_cache = view(DType::bf16, {4, 16, 512}, {16 * 512 + 100, 512, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "whole number of token strides",
               "a non-integral span: block stride 8292 / token stride 512");
  // A page of one row: the token stride it reads is a row's, and the message says why.
  a.swa_kv_cache = view(DType::bf16, {4, 1, 512}, {576, 1, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "whole number of token strides",
               "block stride 576 / token stride 512 (one row: a page of one row has no token "
               "stride of its own, and its 1 is not one a layout could have)");
  // A page of one row whose token stride is a row's (512): the note would be wrong there.
  a.swa_kv_cache = view(DType::bf16, {4, 1, 512}, {600, 512, 1});
  try {
    validate_decode(a);
    ADD_FAILURE() << "no error for a non-integral span";
  } catch (const Error& e) {
    EXPECT_EQ(e.got(), "a non-integral span: block stride 600 / token stride 512");
  }
}

TEST_F(Validation, SpanBelowBlockSize) {
  a.compressed_kv_cache = view(DType::bf16, {4, 16, 1, 512}, {8 * 512, 512, 512, 1});
  expect_error(ErrorKind::value, "compressed_kv_cache", ">= block_size = 16", "span 8");
  a.compressed_kv_cache = view(DType::bf16, {4, 16, 1, 512}, {15 * 512, 512, 512, 1});
  expect_error(ErrorKind::value, "compressed_kv_cache", ">= block_size = 16", "span 15");
}

TEST_F(Validation, TokenStrideBelowRow) {
  a.swa_kv_cache = view(DType::bf16, {4, 16, 512}, {16 * 256, 256, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "token stride >= 512", "256");
  a.swa_kv_cache = view(DType::bf16, {4, 16, 512}, {16 * 511, 511, 1});  // rows one element apart
  expect_error(ErrorKind::value, "swa_kv_cache", "token stride >= 512", "511");
}

TEST_F(Validation, DsMlaPageStride) {
  a.compressed_kv_cache = TensorView{};
  a.swa_kv_cache = view(DType::u8, {4, 16, 584});  // 9344 B pages: not a multiple of 576
  expect_error(ErrorKind::value, "swa_kv_cache",
               "multiple of 576 B and >= block_size * 584 = 9344 B (the least such: 9792 B, each "
               "page padded to a multiple of 576 B)",
               "9344 B");
  a.swa_kv_cache = view(DType::u8, {4, 16, 584}, {16 * 576, 584, 1});  // too small
  expect_error(ErrorKind::value, "swa_kv_cache", "multiple of 576 B", "9216 B");
  // A token stride below 584 B: the view would end before its last page's block_size * 584 B.
  a.swa_kv_cache = view(DType::u8, {4, 16, 584}, {17 * 576, 576, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "token stride >= 584 B", "576 B");
  a.swa_kv_cache = view(DType::u8, {4, 1, 584}, {1152, 0, 1});  // one slot a page: any stride
  EXPECT_NO_THROW(validate_decode(a));
  a.swa_kv_cache = view(DType::u8, {4, 16, 1, 584}, {17 * 576, 584, 584, 1});
  EXPECT_NO_THROW(validate_decode(a));
  // 72 slots a page: 72 * 584 B = 73 * 576 B, a page stride of block_size * 584 B exactly.
  a.swa_kv_cache = view(DType::u8, {2, 72, 584}, {72 * 584, 584, 1});
  EXPECT_NO_THROW(validate_decode(a));
}

// Offsets are int32: a page of 2^31 rows or more is beyond what they address.
TEST_F(Validation, SpanFromInt32) {
  a.swa_kv_cache = view(DType::bf16, {2, 1, 512}, {int64_t(1) << 40, 512, 1});
  expect_error(ErrorKind::unsupported, "swa_kv_cache", "span (rows a page, packing included)",
               "span 2147483648 of [2, 1, 512]");
  // The largest span, 2^31 - 1 rows (one page: its stride is kept as given), is addressed.
  a.swa_kv_cache = view(DType::bf16, {1, 1, 512}, {int64_t(INT32_MAX) * 512, 512, 1});
  EXPECT_NO_THROW(validate_decode(a));
  a.swa_kv_cache = c.args().swa_kv_cache;
  a.compressed_kv_cache = view(DType::bf16, {1, 1, 512}, {int64_t(1) << 40, 512, 1});
  expect_error(ErrorKind::unsupported, "compressed_kv_cache",
               "span (rows a page, packing included)", "span 2147483648 of [1, 1, 512]");
  a.compressed_kv_cache = c.args().compressed_kv_cache;
  // One page: its stride is not bounded by the view's extent, but it must fit in bytes.
  a.swa_kv_cache = view(DType::bf16, {1, 16, 512}, {int64_t(1) << 62, 512, 1});
  expect_error(ErrorKind::value, "swa_kv_cache", "a page stride whose size in bytes fits in int64",
               "4611686018427387904 elements");
  // One page of one row: no extent bounds its token stride, which reads as the packed one
  // (from it the least page stride had been rounded up past int64: "span 0").
  a.compressed_kv_cache = TensorView{};
  for (const DType dtype : {DType::bf16, DType::f8e4m3}) {
    a.swa_kv_cache = view(dtype, {1, 1, 512}, {0, INT64_MAX, 1});
    EXPECT_EQ(validate_decode(a).swa.span, 1);
  }
  // A page of two 1-byte rows: the view's extent bounds one token stride, not the page's two.
  a.swa_kv_cache = view(DType::f8e4m3, {1, 2, 512}, {0, int64_t(3) << 61, 1});
  expect_error(ErrorKind::value, "swa_kv_cache",
               "a page of block_size rows whose size fits in int64",
               "block_size 2 and token stride 6917529027641081856");
}

// A dim of size 1 is read at index 0 alone: a stride no layout could have there (PyTorch up
// to 2.9 exports 1) is not an error.
TEST_F(Validation, SizeOneDimsTakeAnyStride) {
  a.swa_kv_cache = view(DType::bf16, {1, 16, 512}, {1, 512, 1});  // one page
  EXPECT_NO_THROW(validate_decode(a));
  a.swa_kv_cache = view(DType::bf16, {4, 1, 512}, {512, 1, 1});  // one row a page
  EXPECT_NO_THROW(validate_decode(a));
  // A one-row page's leftover token stride past the page stride: a transposed view's, which
  // PyTorch's .contiguous() keeps (torch.empty(1, 4, 512).transpose(0, 1)).
  a.compressed_kv_cache = TensorView{};
  for (const DType dtype : {DType::bf16, DType::f8e4m3}) {
    a.swa_kv_cache = view(dtype, {4, 1, 512}, {512, 2048, 1});
    EXPECT_EQ(validate_decode(a).swa.span, 1);
    a.swa_kv_cache = view(dtype, {4, 1, 512}, {1024, 768, 1});  // no span: the packed one's 2
    EXPECT_EQ(validate_decode(a).swa.span, 2);
  }
  a.swa_kv_cache = view(DType::bf16, {4, 1, 512}, {2048, 1024, 1});  // a real one: span 2
  EXPECT_EQ(validate_decode(a).swa.span, 2);
  a.swa_kv_cache = view(DType::u8, {1, 16, 584}, {1, 584, 1});
  EXPECT_NO_THROW(validate_decode(a));
}

TEST_F(Validation, CumSeqLensStartsAtZero) {
  c.cum_seq_lens_q.set<int32_t>(0, 1);
  expect_error(ErrorKind::value, "cum_seq_lens_q", "cum_seq_lens_q[0] == 0",
               "cum_seq_lens_q[0] = 1");
}

TEST_F(Validation, CumSeqLensNotMonotone) {
  c.cum_seq_lens_q.set<int32_t>(2, 0);  // {0, 1, 4, 6} -> {0, 1, 0, 6}
  expect_error(ErrorKind::value, "cum_seq_lens_q", "non-decreasing",
               "cum_seq_lens_q[1] = 1 > cum_seq_lens_q[2] = 0");
}

TEST_F(Validation, CumSeqLensEndsAtT) {
  c.cum_seq_lens_q.set<int32_t>(3, 5);
  expect_error(ErrorKind::value, "cum_seq_lens_q", "cum_seq_lens_q[B] == T = 6",
               "cum_seq_lens_q[3] = 5");
}

TEST_F(Validation, QLenAboveMaxQLen) {
  a.max_q_len = 2;
  expect_error(ErrorKind::value, "max_q_len", "request 1 has q_len 3", "2");
}

TEST_F(Validation, QLenAboveSeqLen) {
  c.seq_lens.set<int32_t>(1, 2);
  expect_error(ErrorKind::value, "seq_lens", "seq_lens[1] >= q_len = 3", "seq_lens[1] = 2");
}

TEST_F(Validation, NegativeSeqLen) {
  c.seq_lens.set<int32_t>(0, -5);
  expect_error(ErrorKind::value, "seq_lens", "seq_lens[0] >= q_len = 1", "seq_lens[0] = -5");
}

TEST_F(Validation, TopkLenOutsideColumns) {
  c.sparse_topk_lens.set<int32_t>(4, 193);
  expect_error(ErrorKind::value, "sparse_topk_lens", "[0, K = 192]", "sparse_topk_lens[4] = 193");
  c.sparse_topk_lens.set<int32_t>(4, -1);
  expect_error(ErrorKind::value, "sparse_topk_lens", "[0, K = 192]", "sparse_topk_lens[4] = -1");
}

// Device-resident values cannot be read without a sync: only shapes and the like are checked.
TEST_F(Validation, DeviceValuesAreNotRead) {
  c.cum_seq_lens_q.set<int32_t>(2, 0);
  c.seq_lens.set<int32_t>(0, -5);
  c.sparse_topk_lens.set<int32_t>(4, 1000);
  for (const Field& f : kTensorFields) (a.*f.member).device = kCuda;
  EXPECT_NO_THROW(validate_decode(a));
}

// The buffer sizes refuse arguments no launch can have.
TEST(BufferSizes, RefuseImpossibleArguments) {
  const auto cpu = Device{};
  test::expect_smla_error([] { kv_counter_bytes(-1, 64); }, ErrorKind::value, "max_tokens",
                          "0..2^31 - 1", "-1");
  test::expect_smla_error([] { kv_counter_bytes(8, 0); }, ErrorKind::value, "num_heads",
                          "1..128", "0");
  // More heads than the kernels hold: unsupported, as the decode says of a wider query.
  test::expect_smla_error([&] { workspace_bytes(8, 129, 640, cpu); }, ErrorKind::unsupported,
                          "num_heads", "1..128", "129");
  test::expect_smla_error([] { kv_counter_bytes(8, 129); }, ErrorKind::unsupported, "num_heads",
                          "1..128", "129");
  test::expect_smla_error([&] { workspace_bytes(8, 64, int64_t(1) << 40, cpu); },
                          ErrorKind::value, "max_columns", "0..2^31 - 1", "1099511627776");
  EXPECT_EQ(workspace_bytes(8, 64, 640, cpu), 0u);
  EXPECT_EQ(workspace_bytes(8, 128, 640, cpu), 0u);  // 1..128 heads, both ends in
  EXPECT_NO_THROW(kv_counter_bytes(8, 128));
  EXPECT_NO_THROW(kv_counter_bytes(8, 1));
}

// The public entry point validates before it dispatches.
TEST_F(Validation, PublicCallValidates) {
  a.query.dtype = DType::f32;
  test::expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::type, "query", "bf16", "f32");
}

#if !SMLA_WITH_CUDA
// A build without CUDA refuses a valid call on a GPU's tensors as unsupported, naming query.
TEST_F(Validation, DeviceCallWithoutCudaIsUnsupported) {
  for (const Field& f : kTensorFields) (a.*f.member).device = kCuda;
  test::expect_smla_error([&] { sparse_mla_decode(a); }, ErrorKind::unsupported, "query",
                          "a cpu tensor (this build has no CUDA backend)", "cuda:0");
}
#endif

// The capability query answers each refusal with its reason, before it asks any device; the
// CPU takes every supported pairing of dtypes.
TEST(Capability, EveryRefusalSaysWhy) {
  const Device cpu{};
  for (const auto& [query, kv] : {std::pair{DType::bf16, DType::bf16}, {DType::bf16, DType::u8},
                                  {DType::bf16, DType::f8e4m3}, {DType::f8e4m3, DType::f8e4m3}}) {
    const Capability c = query_capability(512, query, kv, 1, cpu);
    EXPECT_TRUE(c.supported && c.reason.empty()) << dtype_name(query) << " " << dtype_name(kv);
  }
  const auto refused = [](const Capability& c, const std::string& reason) {
    EXPECT_FALSE(c.supported) << reason;
    EXPECT_EQ(c.reason, reason);
  };
  refused(query_capability(576, DType::bf16, DType::bf16, 64, kCuda),
          "head size must be 512 (448 NoPE + 64 RoPE), got 576");
  refused(query_capability(512, DType::bf16, DType::bf16, 0, kCuda),
          "block size must be positive, got 0");
  refused(query_capability(512, DType::bf16, DType::f32, 64, cpu),
          "KV cache dtype must be bf16, f8e4m3 or u8 (fp8_ds_mla), got f32");
  for (const auto& [query, kv] : {std::pair{DType::f8e4m3, DType::bf16}, {DType::f8e4m3, DType::u8},
                                  {DType::f32, DType::bf16}})
    refused(query_capability(512, query, kv, 64, cpu),
            std::string("query dtype ") + dtype_name(query) + " does not go with a " +
                dtype_name(kv) + " cache (bf16 query, or f8e4m3 with an f8e4m3 cache)");
#if !SMLA_WITH_CUDA
  refused(query_capability(512, DType::bf16, DType::bf16, 64, kCuda),
          "this build has no CUDA backend");
#endif
}

// A view's rank past 4 and a stride of INT64_MIN (no |stride| in int64) are refused, the
// stride where its dim is stepped.
TEST(CheckHelpers, RankAndLeastStride) {
  std::vector<std::byte> buf(64);
  TensorView five = make_view(buf.data(), DType::f32, Device{}, {1, 1, 1, 4});
  five.ndim = 5;  // one past kMaxDims: refused before shape[4] is read
  test::expect_smla_error([&] { check::view(five, "v"); }, ErrorKind::value, "v", "1..4 dims",
                          "5 dims");
  // |INT64_MIN| is no int64: refused even for 1-byte elements.
  EXPECT_THROW(check::view(make_view(buf.data(), DType::u8, Device{}, {2}, {INT64_MIN}), "v"),
               Error);
  // On a dim of size 1 it is never used, as any other stride there.
  EXPECT_NO_THROW(
      check::view(make_view(buf.data(), DType::u8, Device{}, {1, 4}, {INT64_MIN, 1}), "v"));
}

// Two outputs' runs of bytes that overlap only at one run's end are not apart; a size-1 dim's
// stride, never stepped, makes no overlap.
TEST(CheckHelpers, ApartSeesAnOverlapAtARunsEnd) {
  std::vector<std::byte> buf(64);
  const auto u8 = [&](int64_t offset) {
    return make_view(buf.data() + offset, DType::u8, Device{}, {4, 4}, {8, 1});
  };
  const auto heads = [&](int64_t offset) {
    return make_view(buf.data() + offset, DType::u8, Device{}, {2, 2, 4}, {16, 4, 1});
  };
  // b's runs start past a's but end in a's next run.
  EXPECT_THROW(check::apart(u8(0), "a", u8(5), "b"), Error);
  EXPECT_THROW(check::apart(heads(0), "a", heads(9), "b"), Error);
  // A size-1 dim's stride is never used: it does not break the interleave.
  EXPECT_NO_THROW(check::apart(make_view(buf.data(), DType::u8, Device{}, {4, 1, 4}, {8, 3, 1}),
                               "a", u8(4), "b"));
}

// A required size of 0 is a size (only -1 is any).
TEST(CheckHelpers, ASizeOfZeroIsNoWildcard) {
  std::vector<std::byte> buf(64);
  test::expect_smla_error(
      [&] {
        check::tensor(make_view(buf.data(), DType::i32, Device{}, {3}), "x", DType::i32, Device{},
                      {0}, "[N=0]");
      },
      ErrorKind::value, "x", "[N=0]", "[3]");
}

// cum_seq_lens_q decreasing at its last request is refused there, naming both bounds.
TEST_F(Validation, CumSeqLensDecreasingAtTheLastRequest) {
  c.cum_seq_lens_q.set<int32_t>(2, 7);  // {0, 1, 4, 6} -> {0, 1, 7, 6}
  expect_error(ErrorKind::value, "cum_seq_lens_q", "non-decreasing",
               "cum_seq_lens_q[2] = 7 > cum_seq_lens_q[3] = 6");
}

// One token and no request: the token belongs to none, refused by seq_lens' shape.
TEST_F(Validation, OneTokenWithoutRequests) {
  const int64_t K = a.sparse_indices.size(1);
  a.query = view(DType::bf16, {1, 8, 512});
  a.sparse_indices = view(DType::i32, {1, K});
  a.sparse_topk_lens = view(DType::i32, {1});
  a.seq_lens = view(DType::i32, {0});
  a.cum_seq_lens_q = view(DType::i32, {1});
  expect_error(ErrorKind::value, "seq_lens", "[B >= 1] (the T=1 tokens belong to requests)", "[0]");
}

// fp8_ds_mla page: 3 records of 576 B, then 3 scale records of 8 B at [1728, 1752); token stride
// 1152 leaves [1736, 1752) between the view's rows: only the records view covers it.
TEST_F(Validation, OutputsApartFromDsMlaScaleRecords) {
  a.swa_kv_cache = view(DType::u8, {2, 3, 584}, {2304, 1152, 1});
  a.compressed_kv_cache = TensorView{};
  ASSERT_NO_THROW(validate_decode(a));
  a.workspace = make_view(scratch.data() + 1736, DType::u8, Device{}, {16});
  expect_error(ErrorKind::value, "workspace", "memory apart from swa_kv_cache",
               "an overlap with swa_kv_cache");
}

// Random calls for RandomArguments below: every view in a buffer of its own, random bytes
// throughout and 64 guard bytes either side, so that a write past a view or into the gaps
// between its strided elements changes bytes no output element holds.
class RandomCall {
 public:
  explicit RandomCall(uint64_t seed) : rng_(seed) {}

  int64_t pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // Row-major strides (explicit ones for pools), a gap after each row now and then, and now
  // and then an outer dim stored in reverse.
  TensorView make(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
    const int ndim = static_cast<int>(shape.size());
    if (strides.empty()) {
      strides.assign(ndim, 1);
      for (int d = ndim - 2; d >= 0; --d)
        strides[d] = strides[d + 1] * shape[d + 1] + (d == ndim - 2 && coin(0.3) ? pick(1, 9) : 0);
    }
    const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
    int64_t last = 0;
    bool empty = false;
    for (int d = 0; d < ndim; ++d) {
      last += std::max<int64_t>(shape[d] - 1, 0) * strides[d];
      empty = empty || shape[d] == 0;
    }
    auto& buffer =
        buffers_.emplace_back(std::vector<std::byte>((empty ? 0 : (last + 1) * elem) + 2 * kGuard));
    for (std::byte& b : buffer) b = std::byte(rng_());
    TensorView v;
    v.data = buffer.data() + kGuard;
    v.dtype = dtype;
    v.ndim = ndim;
    for (int d = 0; d < ndim; ++d) v.shape[d] = shape[d], v.strides[d] = strides[d];
    const int outer = static_cast<int>(pick(0, ndim - 1));
    if (ndim > 1 && outer < ndim - 1 && shape[outer] > 1 && coin(0.1)) {
      v.data = static_cast<std::byte*>(v.data) + (shape[outer] - 1) * strides[outer] * elem;
      v.strides[outer] = -strides[outer];
    }
    return v;
  }
  static void set(const TensorView& v, int64_t i, int32_t value) {
    std::memcpy(v.ptr<int32_t>() + i * v.stride(0), &value, sizeof value);
  }

  // One or two of: a size one smaller, a zero stride, a null or misaligned pointer, a dtype no
  // wider, the CUDA device, an absent tensor, a rank outside 1..4, a value at its extremes, the
  // first output laid over another view's buffer.
  void break_some(const std::vector<TensorView*>& views, const std::vector<TensorView*>& values,
                  TensorView* output, const std::function<void()>& scalar) {
    for (int64_t n = pick(0, 2); n-- > 0;) {
      TensorView& v = *views[pick(0, int64_t(views.size()) - 1)];
      if (!v.defined() || v.ndim > kMaxDims) continue;
      const int d = static_cast<int>(pick(0, v.ndim - 1));
      switch (pick(0, 9)) {
        case 0:
          v.shape[d] = std::max<int64_t>(v.shape[d] - 1, 0);
          break;
        case 1:
          v.strides[d] = 0;
          break;
        case 2:
          v.data = nullptr;
          break;
        case 3:  // not a null one: 0x1 is no pointer a check could refuse
          if (v.data) v.data = static_cast<std::byte*>(v.data) + 1;
          break;
        case 4: {
          const DType dtype = DType(pick(0, 4));
          if (dtype_size(dtype) <= dtype_size(v.dtype)) v.dtype = dtype;
          break;
        }
        case 5:
          v.device = Device{DeviceKind::cuda, 0};
          break;
        case 6:
          if (coin(0.5))
            v = TensorView{};
          else
            v.ndim = 5;
          break;
        case 7: {
          const TensorView& w = *values[pick(0, int64_t(values.size()) - 1)];
          if (w.data && w.ndim >= 1 && w.ndim <= kMaxDims && w.shape[0] > 0 &&
              w.dtype == DType::i32)
            set(w, pick(0, w.shape[0] - 1),
                int32_t(std::vector<int64_t>{-1, 0, 1, INT32_MIN, INT32_MAX}[pick(0, 4)]));
          break;
        }
        case 8:
          scalar();
          break;
        case 9: {  // the output somewhere in the buffer of another view, wherever it fits
          if (output->ndim < 1 || output->ndim > kMaxDims || output->numel() <= 0) break;
          const auto& into = buffers_[pick(0, int64_t(buffers_.size()) - 1)];
          const int64_t elem = int64_t(dtype_size(output->dtype));
          int64_t low = 0, high = elem;
          for (int k = 0; k < output->ndim; ++k)
            (output->strides[k] < 0 ? low : high) +=
                std::max<int64_t>(output->shape[k] - 1, 0) * output->strides[k] * elem;
          const int64_t room = int64_t(into.size()) - 2 * kGuard - (high - low);
          if (room >= 0)
            output->data =
                const_cast<std::byte*>(into.data()) + kGuard + pick(0, room / elem) * elem - low;
          break;
        }
      }
    }
  }

  // Calls `call`: it throws smla::Error naming one of `names` and changes no byte, or returns
  // having changed only bytes that `written` marks (its outputs' elements, by address).
  void expect_error_or_only(const std::function<void()>& call, const std::set<std::string>& names,
                            const std::function<void(std::set<const std::byte*>&)>& written) {
    std::vector<std::vector<std::byte>> before(buffers_.begin(), buffers_.end());
    std::set<const std::byte*> allowed;
    try {
      call();
      written(allowed);
    } catch (const Error& e) {
      EXPECT_TRUE(names.count(e.argument())) << e.what();
      EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an smla::Error: " << e.what();
    }
    for (size_t i = 0; i < buffers_.size(); ++i)
      for (size_t k = 0; k < buffers_[i].size(); ++k)
        if (buffers_[i][k] != before[i][k] && !allowed.count(&buffers_[i][k])) {
          ADD_FAILURE() << "byte " << k << " of buffer " << i << " written";
          return;
        }
  }

  // Marks the bytes of every element of `v` (at most 4 dims).
  static void mark(const TensorView& v, std::set<const std::byte*>& bytes) {
    if (!v.defined() || v.numel() == 0) return;
    int64_t n[4] = {1, 1, 1, 1}, st[4] = {};
    for (int d = 0; d < v.ndim; ++d)
      n[4 - v.ndim + d] = v.shape[d], st[4 - v.ndim + d] = v.strides[d];
    const int64_t elem = int64_t(dtype_size(v.dtype));
    for (int64_t i = 0; i < n[0]; ++i)
      for (int64_t j = 0; j < n[1]; ++j)
        for (int64_t k = 0; k < n[2]; ++k)
          for (int64_t l = 0; l < n[3]; ++l)
            for (int64_t b = 0; b < elem; ++b)
              bytes.insert(static_cast<const std::byte*>(v.data) +
                           (i * st[0] + j * st[1] + k * st[2] + l * st[3]) * elem + b);
  }

  // A KV pool of 1..3 pages (packed pages now and then) in `layout` (u8: fp8_ds_mla).
  TensorView pool(DType layout, int64_t& rows) {
    const int64_t pages = pick(1, 3), block = std::vector<int64_t>{1, 2, 16}[pick(0, 2)];
    if (layout == DType::u8) {
      rows = pages * block;
      return make(DType::u8, {pages, block, 584}, {(block * 584 + 575) / 576 * 576, 584, 1});
    }
    const int64_t span = block + pick(0, 1);
    rows = pages * span;
    return make(layout, {pages, block, 512}, {span * 512, 512, 1});
  }

 private:
  static constexpr int64_t kGuard = 64;
  std::mt19937_64 rng_;
  std::deque<std::vector<std::byte>> buffers_;  // stable addresses
};

// Random argument sets, most broken in one or two ways, through the public decode and
// quantizer (the fuzzing of both entry points, kept small): each call throws smla::Error
// naming one of its arguments and writes nothing, or succeeds having written only its outputs'
// elements (decode: out and lse; quantize_kv: each slot's record and scale record).
TEST(RandomArguments, DecodeAndQuantizeThrowOrWriteOnlyTheirOutputs) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::printf("%s\n", seed_note(seed).c_str());  // before a crash, which leaves no trace
  std::fflush(stdout);                           // ctest's pipe: fully buffered
  std::set<std::string> decode_names = {"max_q_len", "window", "bmm1_scale", "bmm2_scale"};
  for (const Field& f : kTensorFields) decode_names.insert(f.name);
  for (int call = 0; call < 200; ++call) {
    SCOPED_TRACE("decode call " + std::to_string(call));
    RandomCall r(seed + call);
    const bool cum = r.coin(0.5);
    const int64_t B = r.pick(1, 3), H = std::vector<int64_t>{1, 3, 8}[r.pick(0, 2)];
    std::vector<int32_t> q_lens(B, 1);
    int64_t T = 0;
    for (int32_t& q : q_lens) T += q = cum ? int32_t(r.pick(0, 2)) : 1;
    DecodeArgs a;
    a.window = r.coin(0.5) ? kWindow : 4;
    const int64_t K = a.window + 4 * r.pick(0, 2);
    int64_t rows = 0, compressed_rows = 0;
    const DType layout = std::vector<DType>{DType::bf16, DType::f8e4m3, DType::u8}[r.pick(0, 2)];
    a.swa_kv_cache = r.pool(layout, rows);
    if (r.coin(0.3)) a.compressed_kv_cache = r.pool(layout, compressed_rows);
    a.query = r.make(DType::bf16, {T, H, 512});
    a.sparse_indices = r.make(DType::i32, {T, K});
    a.sparse_topk_lens = r.make(DType::i32, {T});
    a.seq_lens = r.make(DType::i32, {B});
    if (cum) a.cum_seq_lens_q = r.make(DType::i32, {B + 1});
    if (r.coin(0.5)) a.sinks = r.make(DType::f32, {H});
    a.out = r.make(DType::bf16, {T, H + (r.coin(0.3) ? 2 : 0), 512});
    if (r.coin(0.5)) a.lse = r.make(DType::f32, {T, H});
    a.bmm1_scale = 0.04f;
    for (int64_t b = 0, start = 0; b < B; start += q_lens[b++]) {
      RandomCall::set(a.seq_lens, b, q_lens[b] + int32_t(r.pick(0, 200)));
      a.max_q_len = std::max<int>(a.max_q_len, q_lens[b]);
      if (cum) RandomCall::set(a.cum_seq_lens_q, b, int32_t(start));
      if (cum) RandomCall::set(a.cum_seq_lens_q, b + 1, int32_t(start + q_lens[b]));
    }
    const int64_t most = std::max(rows, compressed_rows);
    for (int64_t t = 0; t < T; ++t) {
      RandomCall::set(a.sparse_topk_lens, t, int32_t(r.pick(0, K)));
      for (int64_t c = 0; c < K; ++c) {
        const int32_t offset = int32_t(r.pick(-2, most + 1));
        std::memcpy(a.sparse_indices.ptr<int32_t>() + t * a.sparse_indices.stride(0) + c, &offset,
                    sizeof offset);
      }
    }
    r.break_some({&a.query, &a.swa_kv_cache, &a.compressed_kv_cache, &a.sparse_indices,
                  &a.sparse_topk_lens, &a.seq_lens, &a.cum_seq_lens_q, &a.sinks, &a.out, &a.lse},
                 {&a.seq_lens, &a.cum_seq_lens_q, &a.sparse_topk_lens},
                 r.coin(0.5) || !a.lse.defined() ? &a.out : &a.lse, [&] {
                   const float odd[] = {0.f, -1.f, NAN, INFINITY, 1e-45f, 3e38f};
                   a.max_q_len = int(r.pick(-1, 2));
                   a.window = r.coin(0.5) ? a.window : int(r.pick(-1, 200));
                   (r.coin(0.5) ? a.bmm1_scale : a.bmm2_scale) = odd[r.pick(0, 5)];
                 });
    r.expect_error_or_only([&] { sparse_mla_decode(a); }, decode_names,
                           [&](std::set<const std::byte*>& written) {
                             RandomCall::mark(a.out, written);
                             RandomCall::mark(a.lse, written);
                           });
  }
  for (int call = 0; call < 100; ++call) {
    SCOPED_TRACE("quantize_kv call " + std::to_string(call));
    RandomCall r(~seed - call);
    int64_t rows = 0;
    TensorView pool =
        r.pool(std::vector<DType>{DType::bf16, DType::f8e4m3, DType::u8}[r.pick(0, 2)], rows);
    const int64_t N = r.pick(0, 4);
    TensorView x = r.make(DType::bf16, {N, 512}), slots = r.make(DType::i32, {N});
    std::vector<int32_t> free_slots(pool.shape[0] * pool.shape[1]);
    for (size_t s = 0; s < free_slots.size(); ++s) free_slots[s] = int32_t(s);
    for (int64_t i = 0; i < N; ++i) {
      if (free_slots.empty()) {  // a pool of fewer rows than N: no pick(0, -1)
        RandomCall::set(slots, i, -1);
        continue;
      }
      const int64_t k = r.pick(0, int64_t(free_slots.size()) - 1);
      RandomCall::set(slots, i, r.coin(0.2) ? -1 : free_slots[k]);
      free_slots.erase(free_slots.begin() + k);
    }
    float kv_scale = 1.f;
    r.break_some({&pool, &x, &slots}, {&slots}, &pool, [&] {
      kv_scale = std::vector<float>{0.f, -0.f, -2.f, NAN, INFINITY, 1e-45f, 3e38f}[r.pick(0, 6)];
    });
    r.expect_error_or_only(
        [&] { quantize_kv(x, slots, pool, kv_scale); }, {"rows", "slots", "pool", "kv_scale"},
        [&](std::set<const std::byte*>& written) {
          const bool ds = pool.dtype == DType::u8;
          const int64_t elem = int64_t(dtype_size(pool.dtype)), record = ds ? 576 : 512 * elem;
          const auto* base = static_cast<const std::byte*>(pool.data);
          const int64_t block = pool.shape[1];  // as broken, if it was
          for (int64_t i = 0; i < slots.shape[0]; ++i) {
            const int32_t s = slots.ptr<int32_t>()[i * slots.stride(0)];
            if (s < 0) continue;
            // A size-1 dim's stride is not used (and may be any): page 0 or row 0 alone.
            const int64_t page = s / block, row = s % block;
            const std::byte* at = base + (page ? page * pool.strides[0] * elem : 0);
            for (int64_t b = 0; b < record; ++b)
              written.insert(at + (ds ? row * 576 : row ? row * pool.strides[1] * elem : 0) + b);
            for (int64_t b = 0; ds && b < 8; ++b) written.insert(at + block * 576 + row * 8 + b);
          }
        });
  }
}

// An error's text is "smla: <argument>: expected <expected>, got <got>".
TEST(ErrorText, ArgumentExpectedGot) {
  const Error e(ErrorKind::type, "query", "bf16", "f32");
  EXPECT_STREQ(e.what(), "smla: query: expected bf16, got f32");
}

}  // namespace
}  // namespace smla::test
