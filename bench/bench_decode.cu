// Decode-kernel benchmark on DeepSeek-V4 shapes for each cache layout: median kernel time over
// graph replays with inputs rotated through more memory than L2, launches chained as a step's
// layers and each alone (after the previous one ended), against the roofline floor
// measured in the same run (from the bytes each layout moves) and FlashMLA's anchors
// (DESIGN.md). Prints a table; --csv writes it too.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "args.h"
#include "board_power.h"
#include "ceilings.h"
#include "csv_file.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/decode_plan.h"
#include "cuda/device.h"
#include "format.h"
#include "smla/decode.h"
#include "smla/error.h"
#include "smla/streams.h"
#include "stdout_status.h"
#include "timing.h"

using namespace smla;

namespace {

struct Shape {
  int heads, requests, tokens_per_request, topk;
};

// A cache layout as benchmarked: its query dtype and the bytes a row moves from DRAM
// (fp8_ds_mla: the 576-B record plus the 32-byte sector of the page footer its 8 scale bytes
// lie in, the least an L2 miss fetches).
struct Layout {
  const char* name;
  KvLayout kv;
  DType query;
  int row_bytes;
  int gather_row_bytes;  // the row size the gather ceiling is measured with
  // An e4m3 query's scores (half the FLOP) may run as e4m3 wgmma (the kernel's kF16 scores
  // do), so the compute floor charges them at the e4m3 matmul rate; P.V at the bf16 rate.
  bool e4m3_scores;
};
constexpr Layout kLayouts[] = {{"bf16", KvLayout::bf16, DType::bf16, 1024, 1024, false},
                               {"fp8_ds_mla", KvLayout::fp8_ds_mla, DType::bf16, 608, 576, false},
                               {"fp8_e4m3", KvLayout::fp8_e4m3, DType::f8e4m3, 512, 512, true}};

// Dense matmul FLOP/s measured in the same run.
struct MatmulRates {
  double bf16, e4m3;
};

// FlashMLA sparse decode, fp8_ds_mla cache, 2 tokens per request, top-k 512 at H=64 and 1024
// at H=128 (DESIGN.md, H200); 0 for any other shape.
double flashmla_anchor_us(const Shape& s) {
  if (s.tokens_per_request != 2 || s.topk != (s.heads == 64 ? 512 : 1024)) return 0;
  struct Anchor { int heads, requests; double us; };
  static const Anchor anchors[] = {{64, 2, 14.9},    {64, 64, 49.5},    {64, 128, 90.9},
                                   {64, 256, 173.2}, {128, 2, 17.3},    {128, 64, 105.1},
                                   {128, 128, 203.6}, {128, 256, 402.0}};
  for (const Anchor& a : anchors)
    if (a.heads == s.heads && a.requests == s.requests) return a.us;
  return 0;
}

constexpr int64_t kPoolBytes = int64_t(2) << 30;
constexpr int kBlockSize = 64;
constexpr int64_t kDsMlaPageBytes = 65 * kDsMlaRecordBytes;  // >= 64 x 584, a multiple of 576

int64_t pool_rows(const Layout& l) {
  return l.kv == KvLayout::fp8_ds_mla ? kPoolBytes / kDsMlaPageBytes * kBlockSize
                                      : kPoolBytes / l.row_bytes;
}

TensorView pool_view(void* pool, const Layout& l, Device dev) {
  const int64_t blocks = pool_rows(l) / kBlockSize;
  switch (l.kv) {
    case KvLayout::fp8_ds_mla:
      return make_view(pool, DType::u8, dev,
                       {blocks, kBlockSize, kDsMlaRecordBytes + kDsMlaScaleBytes},
                       {kDsMlaPageBytes, kDsMlaRecordBytes + kDsMlaScaleBytes, 1});
    case KvLayout::fp8_e4m3: return make_view(pool, DType::f8e4m3, dev, {blocks, kBlockSize, 512});
    default: return make_view(pool, DType::bf16, dev, {blocks, kBlockSize, 512});
  }
}

// Normal-like element bytes: bf16 N(0, 1), e4m3 codes of magnitude 2^-3..2^3, UE8M0 scales
// 2^-3..2^3. Data decide how often the kernel rescales, so they should look like real K/V/Q.
struct ValueBytes {
  std::mt19937& rng;
  std::normal_distribution<float> normal{0.f, 1.f};
  std::uniform_int_distribution<int> bit{0, 1}, exponent{4, 9}, mantissa{0, 7}, scale{124, 130};

  uint8_t e4m3() { return uint8_t(bit(rng) << 7 | exponent(rng) << 3 | mantissa(rng)); }
  uint8_t ue8m0() { return uint8_t(scale(rng)); }
  void bf16(uint8_t* at) {
    const __nv_bfloat16 x = __float2bfloat16(normal(rng));
    std::memcpy(at, &x, 2);
  }
};

// The pool as rows of the layout (fp8_ds_mla: records of e4m3 codes and bf16 RoPE, then the
// page's scales), a chunk of whole pages repeated.
void fill_pool(void* pool, const Layout& l, std::mt19937& rng) {
  const bool ds = l.kv == KvLayout::fp8_ds_mla;
  const int64_t unit = ds ? kDsMlaPageBytes : 2;
  std::vector<uint8_t> chunk(((size_t(1) << 25) / unit) * unit);
  ValueBytes v{rng};
  if (l.kv == KvLayout::bf16)
    for (size_t i = 0; i < chunk.size(); i += 2) v.bf16(&chunk[i]);
  else if (!ds)
    for (auto& x : chunk) x = v.e4m3();
  else
    for (size_t page = 0; page < chunk.size(); page += kDsMlaPageBytes) {
      std::fill_n(&chunk[page], kDsMlaPageBytes, uint8_t(0));
      for (int r = 0; r < kBlockSize; ++r) {
        uint8_t* rec = &chunk[page + r * kDsMlaRecordBytes];
        for (int d = 0; d < kNopeDim; ++d) rec[d] = v.e4m3();
        for (int d = 0; d < kRopeDim; ++d) v.bf16(rec + kNopeDim + 2 * d);
        uint8_t* scales = &chunk[page + kBlockSize * kDsMlaRecordBytes + r * kDsMlaScaleBytes];
        for (int g = 0; g < 7; ++g) scales[g] = v.ue8m0();
      }
    }
  for (int64_t off = 0; off < kPoolBytes; off += chunk.size())
    SMLA_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(pool) + off, chunk.data(),
                               std::min<int64_t>(chunk.size(), kPoolBytes - off),
                               cudaMemcpyHostToDevice));
}

__global__ void empty_kernel() {}

// What alone_us holds besides the kernel: an empty kernel's time measured the same way (a graph
// replay's start on the GPU and the events around it).
double empty_alone_us() {
  return 1e3 * bench::median_launch_ms(
                   8,
                   [](cudaStream_t stream, int) {
                     empty_kernel<<<1, 32, 0, stream>>>();
                     SMLA_CUDA_CHECK(cudaGetLastError());
                   },
                   30, false);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* p;
  SMLA_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(T)));
  SMLA_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Result {
  Shape shape;
  int splits;
  bool cluster;  // split rows reduced in their cluster (else through the counters)
  int64_t ctas;
  double us, tflops, gbps, floor_us, anchor_us;
  double alone_us;  // launched after the previous launch has ended (us: overlapping its end)
  // us and alone_us again, the GPU busy with the launches for a while first (0: not measured),
  // and the board's mean power over the chained ones and their warm-up (0: not read)
  double sustained_us, sustained_alone_us, sustained_watts;
};

// Each launch of a replay reads its own indices; with `rotate_all` (the default) its own query
// and output buffers too, so that none of them is in L2 from an earlier launch. Without it those
// may be, so the bytes (and the floor) count the rows and indices alone.
struct Replay {
  int T, H, K, q_bytes;
  double bytes;         // a launch moves
  int sets;             // launches a replay
  int io_sets;          // query and output buffers
  double device_bytes;  // the replay's buffers hold, beside the pool

  Replay(const Shape& shape, const Layout& layout, bool rotate_all, size_t l2_bytes)
      : T(shape.requests * shape.tokens_per_request),
        H(shape.heads),
        K(kWindow + shape.topk),
        q_bytes(int(dtype_size(layout.query))) {
    const double io = double(T) * H * 512 * (q_bytes + 2), indices = double(T) * K * 4;
    bytes = double(T) * K * layout.row_bytes + (rotate_all ? io : 0) + indices;
    // Three times the L2 a replay, and at least 8 launches: the event between replays ends the
    // programmatic dependent launch chain, so each replay's first launch starts alone. A launch
    // moves at least 129 rows of 512 B, so a 50-100 MB L2 takes a few thousand at most.
    sets = int(std::max<double>(std::ceil(3.0 * double(l2_bytes) / bytes), 8));
    io_sets = rotate_all ? sets : 1;
    device_bytes = sets * indices + io_sets * io;
  }
};

// The GPU the numbers come from. FlashMLA's anchors were measured on an H200 and are shown
// only beside an H200's times.
struct Gpu {
  std::string name;
  int sms = 0;
  size_t l2_bytes = 0;
  bool h200 = false;
};

Gpu current_gpu() {
  cudaDeviceProp prop{};
  SMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda::current_device()));
  return {prop.name, prop.multiProcessorCount, size_t(prop.l2CacheSize),
          std::strstr(prop.name, "H200") != nullptr};
}

Result run_shape(const Shape& shape, const Layout& layout, void* pool, double gather_bw,
                 MatmulRates matmul, bool rotate_all, double sustained_ms, const Gpu& gpu,
                 std::mt19937& rng) {
  const Replay replay(shape, layout, rotate_all, gpu.l2_bytes);
  const int T = replay.T, H = replay.H, K = replay.K, q_bytes = replay.q_bytes;
  const int sets = replay.sets;
  const double bytes = replay.bytes;
  const Device dev{DeviceKind::cuda, cuda::current_device()};
  const double flops = 4.0 * T * K * H * 512;

  std::uniform_int_distribution<int32_t> row(0, int32_t(pool_rows(layout) - 1));
  std::vector<int32_t> cum(shape.requests + 1), seq(shape.requests, 100000), lens(T, K);
  for (int b = 0; b <= shape.requests; ++b) cum[b] = b * shape.tokens_per_request;
  int32_t *d_cum = device_copy(cum), *d_seq = device_copy(seq), *d_lens = device_copy(lens);
  std::vector<int32_t*> d_indices(sets);
  std::vector<int32_t> indices(size_t(T) * K);
  for (auto& d : d_indices) {
    for (auto& x : indices) x = row(rng);
    d = device_copy(indices);
  }
  std::vector<uint8_t> q(size_t(T) * H * 512 * q_bytes);
  ValueBytes v{rng};
  for (size_t i = 0; i < q.size(); i += q_bytes) {
    if (q_bytes == 1)
      q[i] = v.e4m3();
    else
      v.bf16(&q[i]);
  }
  const size_t out_bytes = size_t(T) * H * 512 * 2;
  std::vector<uint8_t*> d_qs(replay.io_sets);
  std::vector<void*> d_outs(d_qs.size());
  for (size_t i = 0; i < d_qs.size(); ++i) {
    d_qs[i] = device_copy(q);
    SMLA_CUDA_CHECK(cudaMalloc(&d_outs[i], out_bytes));
    SMLA_CUDA_CHECK(cudaMemset(d_outs[i], 0xff, out_bytes));  // NaN until written
  }
  const size_t ws_bytes = workspace_bytes(T, H, K, dev), counter_bytes = kv_counter_bytes(T, H);
  void *d_ws = nullptr, *d_counters = nullptr;
  SMLA_CUDA_CHECK(cudaMalloc(&d_ws, std::max<size_t>(ws_bytes, 16)));
  SMLA_CUDA_CHECK(cudaMalloc(&d_counters, counter_bytes));
  SMLA_CUDA_CHECK(cudaMemset(d_counters, 0, counter_bytes));

  DecodeArgs args;
  args.swa_kv_cache = pool_view(pool, layout, dev);
  args.seq_lens = make_view(d_seq, DType::i32, dev, {shape.requests});
  args.cum_seq_lens_q = make_view(d_cum, DType::i32, dev, {shape.requests + 1});
  args.max_q_len = shape.tokens_per_request;
  args.sparse_topk_lens = make_view(d_lens, DType::i32, dev, {T});
  args.bmm1_scale = 1.f / std::sqrt(512.f);
  args.workspace = make_view(d_ws, DType::u8, dev, {int64_t(std::max<size_t>(ws_bytes, 16))});
  args.kv_counters = make_view(d_counters, DType::u8, dev, {int64_t(counter_bytes)});
  const auto launch = [&](cudaStream_t stream, int s) {
    args.sparse_indices = make_view(d_indices[s], DType::i32, dev, {T, K});
    args.query = make_view(d_qs[s % d_qs.size()], layout.query, dev, {T, H, 512});
    args.out = make_view(d_outs[s % d_outs.size()], DType::bf16, dev, {T, H, 512});
    sparse_mla_decode(args, stream);
  };
  const double ms = bench::median_launch_ms(sets, launch, 30, true);
  const double alone_ms = bench::median_launch_ms(sets, launch, 30, false);
  const cuda::DecodePlan plan = cuda::plan_decode(
      T, H, K, layout.kv, cuda::decode_occupancy(dev.id), ws_bytes, counter_bytes);

  Result r{shape, plan.num_splits, plan.cluster, plan.ctas, 0, 0, 0, 0,
           gpu.h200 ? flashmla_anchor_us(shape) : 0};
  r.us = ms * 1e3;
  r.alone_us = alone_ms * 1e3;
  if (sustained_ms > 0) {
    r.sustained_watts = cli::mean_board_watts(dev.id, [&] {
      r.sustained_us = 1e3 * bench::median_launch_ms(sets, launch, 30, true, sustained_ms);
    });
    r.sustained_alone_us = 1e3 * bench::median_launch_ms(sets, launch, 30, false, sustained_ms);
  }
  r.tflops = flops / (r.us * 1e-6) / 1e12;
  r.gbps = bytes / (r.us * 1e-6) / 1e9;
  const double compute_s =
      flops / 2 / (layout.e4m3_scores ? matmul.e4m3 : matmul.bf16) + flops / 2 / matmul.bf16;
  r.floor_us = std::max(bytes / gather_bw, compute_s) * 1e6;
  // A time is only worth reporting for launches that wrote their output: each output buffer
  // finite and not all zero (the inputs are random).
  std::vector<uint16_t> out(size_t(T) * H * 512);
  for (void* d_out : d_outs) {
    SMLA_CUDA_CHECK(cudaMemcpy(out.data(), d_out, out_bytes, cudaMemcpyDeviceToHost));
    const bool finite = std::all_of(out.begin(), out.end(),
                                    [](uint16_t b) { return (b & 0x7f80) != 0x7f80; });
    const bool written =
        std::any_of(out.begin(), out.end(), [](uint16_t b) { return b & 0x7fff; });
    if (!finite || !written) {
      std::fprintf(stderr, "smla_bench: %s %d:%d:%d:%d wrote %s\n", layout.name, H,
                   shape.requests, shape.tokens_per_request, shape.topk,
                   finite ? "only zeros" : "a NaN or inf");
      std::exit(1);
    }
  }
  for (int32_t* d : d_indices) SMLA_CUDA_CHECK(cudaFree(d));
  for (uint8_t* d : d_qs) SMLA_CUDA_CHECK(cudaFree(d));
  for (void* d : d_outs) SMLA_CUDA_CHECK(cudaFree(d));
  for (void* p : {(void*)d_cum, (void*)d_seq, (void*)d_lens, d_ws, d_counters})
    SMLA_CUDA_CHECK(cudaFree(p));
  return r;
}

std::vector<Shape> issue_shapes() {
  std::vector<Shape> shapes;
  for (int heads : {64, 128})
    for (int tokens : {1, 2})
      for (int requests : {1, 2, 8, 32, 64, 128, 256})
        shapes.push_back({heads, requests, tokens, heads == 64 ? 512 : 1024});
  // Fewer heads a GPU at 128 requests, against H=64 at the same top-k: 512 (V4-Flash), and 1024
  // (V4-Pro's 128 heads sharded over 4-16 GPUs).
  for (int topk : {512, 1024})
    for (int heads : {8, 16, 32, 64})
      for (int tokens : {1, 2})
        if (heads < 64 || topk != 512) shapes.push_back({heads, 128, tokens, topk});
  return shapes;
}

constexpr const char* kUsage =
    "usage: smla_bench [--csv PATH] [--shape HEADS:REQUESTS:TOKENS:TOPK[,...]] "
    "[--kv bf16|fp8_ds_mla|fp8_e4m3 (default: all; fp8 = fp8_e4m3)] "
    "[--rotate indices|all (default: all)] [--sustained MS (default: 0)]\n"
    "  --rotate all: each launch reads its own indices and query and writes its own output\n"
    "  buffer; indices: one query and output buffer a shape, which may stay in L2 (the bytes and\n"
    "  the floor then count the rows and indices alone)\n"
    "  --sustained MS: also time each shape's launches, chained and alone, after MS ms of them,\n"
    "  over MS ms more (the clock a card holds at its power limit), and the bf16 matmul rate so;\n"
    "  sust_W: the board's mean power over the chained ones (NVML's energy counter)\n";

// HEADS:REQUESTS:TOKENS:TOPK, each field whole and in range, TOPK a multiple of 4; else a
// UsageError naming it.
Shape parse_shape(std::string_view text) {
  constexpr std::string_view kFields[] = {"HEADS", "REQUESTS", "TOKENS", "TOPK"};
  constexpr int kMost[] = {128, 1 << 16, 1024, 1 << 16};
  int values[4];
  const std::string whole(text);
  for (int f = 0; f < 4; ++f) {
    const size_t colon = text.find(':');
    if ((colon == std::string_view::npos) != (f == 3))
      throw cli::UsageError("--shape: expected HEADS:REQUESTS:TOKENS:TOPK, got '" + whole +
                            (f < 3 ? "' (too few fields)" : "' (too many fields)"));
    values[f] = cli::number("--shape " + std::string(kFields[f]), text.substr(0, colon), 1,
                            kMost[f]);
    if (f < 3) text.remove_prefix(colon + 1);
  }
  // A table row is W + P columns, P a multiple of 4 (SPEC §1).
  if (values[3] % 4 != 0)
    throw cli::UsageError("--shape TOPK: expected a multiple of 4, got " +
                          std::to_string(values[3]) + " in '" + whole + "'");
  return {values[0], values[1], values[2], values[3]};
}

struct Options {
  std::string csv_path;
  std::vector<Shape> shapes = issue_shapes();
  std::vector<Layout> layouts{std::begin(kLayouts), std::end(kLayouts)};
  bool rotate_all = true;
  int sustained_ms = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  const std::vector<std::string_view> words = cli::words_of(argc, argv);
  constexpr std::string_view valued[] = {"--csv", "--shape", "--kv", "--rotate", "--sustained"};
  cli::parse_flags(words, valued, {}, [&](std::string_view flag, std::string_view value) {
    if (flag == "--csv") o.csv_path = cli::csv_path(value);
    if (flag == "--shape") {
      o.shapes.clear();
      for (size_t comma; (comma = value.find(',')) != std::string_view::npos;
           value.remove_prefix(comma + 1))
        o.shapes.push_back(parse_shape(value.substr(0, comma)));
      o.shapes.push_back(parse_shape(value));
    }
    if (flag == "--sustained") o.sustained_ms = cli::number("--sustained", value, 0, 60000);
    if (flag == "--rotate") {
      if (value != "indices" && value != "all")
        throw cli::UsageError("--rotate: expected indices|all, got '" + std::string(value) + "'");
      o.rotate_all = value == "all";
    }
    if (flag == "--kv") {
      o.layouts.clear();
      for (const Layout& l : kLayouts)
        if (value == l.name || (value == "fp8" && l.kv == KvLayout::fp8_e4m3)) o.layouts = {l};
      if (o.layouts.empty())
        throw cli::UsageError("--kv: expected bf16|fp8_ds_mla|fp8_e4m3 (fp8 = fp8_e4m3), got '" +
                              std::string(value) + "'");
    }
  });
  return o;
}

// Throws, naming --shape, for the first shape whose replay, workspace and counters would not fit
// the GPU's free memory beside the pool (the host's copies are no larger).
void require_memory(const std::vector<Shape>& shapes, const std::vector<Layout>& layouts,
                    bool rotate_all, size_t l2_bytes) {
  size_t free = 0, total = 0;
  SMLA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const double room = double(free) - double(kPoolBytes);
  const Device dev{DeviceKind::cuda, cuda::current_device()};
  for (const Shape& s : shapes)
    for (const Layout& l : layouts) {
      const Replay replay(s, l, rotate_all, l2_bytes);
      const double need = replay.device_bytes +
                          double(workspace_bytes(replay.T, replay.H, replay.K, dev)) +
                          double(kv_counter_bytes(replay.T, replay.H));
      if (need > room) {
        char got[160];
        std::snprintf(got, sizeof got, "%d:%d:%d:%d (%s) needs %.1f GiB", s.heads, s.requests,
                      s.tokens_per_request, s.topk, l.name, need / double(1 << 30));
        char expected[160];
        std::snprintf(expected, sizeof expected,
                      "a shape whose buffers fit the GPU's %.1f GiB free beside the %.0f GiB pool",
                      free / double(1 << 30), kPoolBytes / double(1 << 30));
        throw Error(ErrorKind::value, "--shape", expected, got);
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(kUsage, stdout);
      return cli::stdout_status("smla_bench", 0);
    }
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "smla_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  const std::vector<Shape>& shapes = o.shapes;
  const std::vector<Layout>& layouts = o.layouts;
  try {
    make_streams({DeviceKind::cuda, 0});  // throws, saying why, when no GPU can run the kernels
    // What can fail for the asking fails before the ceilings are measured: the CSV's path, and
    // a shape whose buffers the GPU cannot hold beside the pool.
    cli::CsvFile csv_file(o.csv_path);
    const Gpu gpu = current_gpu();
    require_memory(shapes, layouts, o.rotate_all, gpu.l2_bytes);
    MatmulRates matmul{bench::measure_bf16_matmul_rate(), 0};
    std::string e4m3_csv;  // empty where the rate is assumed, not measured
    try {
      matmul.e4m3 = bench::measure_e4m3_matmul_rate();
      char text[32];
      std::snprintf(text, sizeof text, "%.1f", matmul.e4m3 / 1e12);
      e4m3_csv = text;
    } catch (const Error& e) {  // the table is worth having without it: say so and go on
      std::fprintf(stderr, "smla_bench: no e4m3 matmul rate (%s); 2x bf16's assumed\n", e.what());
      matmul.e4m3 = 2 * matmul.bf16;
    }
    std::printf("device: %s, %d SMs, L2 %.1f MiB%s\n", gpu.name.c_str(), gpu.sms,
                gpu.l2_bytes / 1048576.0,
                gpu.h200 ? "" : " (FlashMLA's anchors are an H200's: not shown)");
    std::printf("ceilings: matmul bf16 %.0f, e4m3 %.0f%s TFLOP/s; random row gather",
                matmul.bf16 / 1e12, matmul.e4m3 / 1e12,
                e4m3_csv.empty() ? " (2x bf16 assumed)" : "");
    std::vector<double> gather_bw;
    for (const Layout& l : layouts) {
      gather_bw.push_back(bench::measure_gather_bandwidth(l.gather_row_bytes));
      std::printf(" %d B %.2f TB/s%s", l.gather_row_bytes, gather_bw.back() / 1e12,
                  &l == &layouts.back() ? "\n" : ",");
    }
    const cuda::Occupancy occupancy = cuda::decode_occupancy(cuda::current_device());
    std::printf("decode CTAs at once: %d alone; in clusters of", occupancy.ctas);
    for (int c = 2; c <= cuda::kMaxClusterSplits; ++c)
      std::printf(" %d: %d%s", c, occupancy.cluster_ctas[c],
                  c == cuda::kMaxClusterSplits ? "\n" : ",");
    std::printf("workspace for 256 requests x 2 tokens, 128+1024, MiB:");
    for (const int heads : {8, 16, 32, 64, 128}) {
      const size_t ws = workspace_bytes(512, heads, kWindow + 1024,
                                        {DeviceKind::cuda, cuda::current_device()});
      std::printf(" H=%d %.1f%s", heads, ws / 1048576.0, heads == 128 ? "\n" : ",");
    }

    std::printf("an empty kernel alone: %.1f us\n", empty_alone_us());
    if (o.sustained_ms > 0) {
      double rate = 0;
      const double watts = cli::mean_board_watts(
          cuda::current_device(), [&] { rate = bench::measure_bf16_matmul_rate(o.sustained_ms); });
      std::printf("sustained (%d ms busy first, %d ms timed): matmul bf16 %.0f TFLOP/s",
                  o.sustained_ms, o.sustained_ms, rate / 1e12);
      if (watts > 0) std::printf(" at %.0f W", watts);
      std::printf("\n");
    }
    std::printf("each launch of a replay has its own %s\n",
                o.rotate_all ? "indices, query and output buffer"
                             : "indices (one query and output buffer a shape)");
    void* pool;
    SMLA_CUDA_CHECK(cudaMalloc(&pool, kPoolBytes));
    std::mt19937 rng(2026);

    FILE* csv = csv_file.get();
    if (csv)
      std::fprintf(csv,
                   "kv,heads,requests,tokens_per_request,topk,splits,ctas,us,alone_us,tflops,gbps,"
                   "floor_us,floor_fraction,flashmla_us,columns,cluster,rotate,gather_tbps,"
                   "matmul_tflops,e4m3_matmul_tflops,device,sustained_us,sustained_alone_us,"
                   "sustained_watts\n");
    std::printf("%-10s %4s %5s %3s %9s %6s %5s %9s %9s %9s %10s %6s %8s %8s %9s %6s %9s\n", "kv",
                "H", "req", "q", "topk", "splits", "ctas", "us", "alone_us", "sust_us",
                "sust_alone", "sust_W", "TFLOP/s", "GB/s", "floor_us", "floor%", "FlashMLA");
    for (size_t li = 0; li < layouts.size(); ++li) {
      fill_pool(pool, layouts[li], rng);
      for (const Shape& s : shapes) {
        const Layout& l = layouts[li];
        const Result r = run_shape(s, l, pool, gather_bw[li], matmul, o.rotate_all,
                                   o.sustained_ms, gpu, rng);
        const std::string anchor = r.anchor_us > 0 ? std::to_string(r.anchor_us).substr(0, 6) : "-";
        // "-" in the table and empty in the CSV where not measured
        const std::string sustained = cli::measured(r.sustained_us, "%.1f", "-"),
                          sustained_alone = cli::measured(r.sustained_alone_us, "%.1f", "-"),
                          watts = cli::measured(r.sustained_watts, "%.0f", "-");
        std::printf(
            "%-10s %4d %5d %3d %4d+%-4d %5d%c %5lld %9.1f %9.1f %9s %10s %6s %8.1f %8.0f %9.1f "
            "%5.0f%% %9s\n",
            l.name, s.heads, s.requests, s.tokens_per_request, kWindow, s.topk, r.splits,
            r.cluster ? 'c' : ' ', (long long)r.ctas, r.us, r.alone_us, sustained.c_str(),
            sustained_alone.c_str(), watts.c_str(), r.tflops, r.gbps, r.floor_us,
            100 * r.floor_us / r.us, anchor.c_str());
        std::fflush(stdout);
        if (csv) {
          std::fprintf(csv,
                       "%s,%d,%d,%d,%d,%d,%lld,%.2f,%.2f,%.1f,%.0f,%.2f,%.3f,%s,%d,%d,%s,%.3f,"
                       "%.1f,%s,\"%s\",%s,%s,%s\n",
                       l.name, s.heads, s.requests, s.tokens_per_request, s.topk, r.splits,
                       (long long)r.ctas, r.us, r.alone_us, r.tflops, r.gbps, r.floor_us,
                       r.floor_us / r.us, r.anchor_us > 0 ? anchor.c_str() : "", kWindow + s.topk,
                       int(r.cluster), o.rotate_all ? "all" : "indices", gather_bw[li] / 1e12,
                       matmul.bf16 / 1e12, e4m3_csv.c_str(), gpu.name.c_str(),
                       cli::measured(r.sustained_us, "%.2f", "").c_str(),
                       cli::measured(r.sustained_alone_us, "%.2f", "").c_str(),
                       cli::measured(r.sustained_watts, "%.0f", "").c_str());
          std::fflush(csv);  // the rows so far survive a run killed at its time limit
        }
      }
    }
    csv_file.close();
    SMLA_CUDA_CHECK(cudaFree(pool));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla_bench: %s\n", e.what());
    return 1;
  }
  return cli::stdout_status("smla_bench", 0);  // the table, its whole point
}
