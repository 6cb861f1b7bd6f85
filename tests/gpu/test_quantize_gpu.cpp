// The CUDA quantizer against the CPU quantizer (the spec, itself checked against float64 in
// tests/cpu/test_quantize.cpp) byte for byte over whole pools poisoned beforehand: every bf16
// value, every UE8M0 exponent, random packed pages with padding slots and extreme groups, slots
// past the pool (skipped on the device), graph capture. Random inputs replay with SMLA_TEST_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "case_gen.h"
#include "cuda/quantize.h"
#include "device_case.h"
#include "device_step.h"
#include "error_check.h"
#include "quantize_inputs.h"
#include "smla/error.h"
#include "smla/quantize.h"

namespace smla::test {
namespace {

constexpr Device kGpu{DeviceKind::cuda, 0};
constexpr std::byte kPoison{0xab};

HostTensor poisoned_pool(const PoolShape& shape) { return filled_pool(shape, kPoison); }

HostTensor i32_tensor(const std::vector<int32_t>& values) {
  HostTensor t = HostTensor::make(DType::i32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set<int32_t>(static_cast<int64_t>(i), values[i]);
  return t;
}

TensorView host_view(HostTensor& t) { return t.view(t.bytes.data(), Device{}); }

// A host tensor's bytes, every one of them (gaps and page tails too), in device memory, then
// `guard` bytes of poison that no call may write.
struct OnDevice {
  DeviceMemory memory;
  TensorView view;
  size_t size;
  explicit OnDevice(const HostTensor& t, size_t guard = 0)
      : memory(t.bytes.size() + guard), view(t.view(memory.get(), kGpu)), size(t.bytes.size()) {
    CUDA_THROW(cudaMemcpy(memory.get(), t.bytes.data(), size, cudaMemcpyHostToDevice));
    CUDA_THROW(cudaMemset(static_cast<std::byte*>(memory.get()) + size, int(kPoison), guard));
    // A pageable copy may return before its DMA lands, on the legacy stream, which the tests'
    // non-blocking streams do not wait for.
    CUDA_THROW(cudaDeviceSynchronize());
  }
  std::vector<std::byte> bytes() const { return copy(0, size); }
  bool guard_intact() const {
    const std::vector<std::byte> guard = copy(size, memory.bytes() - size);
    return std::all_of(guard.begin(), guard.end(), [](std::byte b) { return b == kPoison; });
  }

 private:
  std::vector<std::byte> copy(size_t from, size_t count) const {
    std::vector<std::byte> b(count);
    CUDA_THROW(cudaMemcpy(b.data(), static_cast<const std::byte*>(memory.get()) + from, count,
                          cudaMemcpyDeviceToHost));
    return b;
  }
};

// The pool's bytes after quantize_kv on the CPU, on a copy of `pool`.
std::vector<std::byte> on_cpu(const Rows& rows, const std::vector<int32_t>& slots, HostTensor pool,
                              float kv_scale) {
  Rows r = rows;
  HostTensor s = i32_tensor(slots);
  quantize_kv(host_view(r.t), host_view(s), host_view(pool), kv_scale);
  return pool.bytes;
}

// The pool's bytes after quantize_kv on the GPU (on a stream of its own), from the same bytes.
std::vector<std::byte> on_gpu(const Rows& rows, const std::vector<int32_t>& slots,
                              const HostTensor& pool, float kv_scale) {
  // Slots one page past the pool would write up to two pages past it.
  const OnDevice r(rows.t), s(i32_tensor(slots)), p(pool, 2 * pool.bytes.size());
  TestStream stream;
  quantize_kv(r.view, s.view, p.view, kv_scale, stream.get());
  stream.synchronize();
  EXPECT_TRUE(p.guard_intact()) << "bytes past the pool written";
  return p.bytes();
}

std::string hex(std::byte b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02x", static_cast<unsigned>(b));
  return s;
}

::testing::AssertionResult same_bytes(const std::vector<std::byte>& gpu,
                                      const std::vector<std::byte>& cpu) {
  if (gpu.size() != cpu.size())
    return ::testing::AssertionFailure() << gpu.size() << " bytes vs " << cpu.size();
  int64_t bad = 0;
  std::ostringstream where;
  for (size_t b = 0; b < gpu.size(); ++b)
    if (gpu[b] != cpu[b] && bad++ < 8)
      where << "\n  pool byte " << b << ": gpu " << hex(gpu[b]) << ", cpu " << hex(cpu[b]);
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << gpu.size() << " bytes differ"
                                       << where.str();
}

// A bf16 of random sign and mantissa with biased exponent `exp` (0: zero or subnormal).
uint16_t bf16_bits(Rng& rng, int64_t exp) {
  return static_cast<uint16_t>((rng.uniform(0, 1) << 15) | (std::clamp<int64_t>(exp, 0, 254) << 7) |
                               rng.uniform(0, 127));
}

uint16_t special(Rng& rng) {
  const uint16_t s[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7f80, 0xff80,
                        0x7fc0, 0xffc0, 0x7f81, 0xffff, 0x7f7f, 0xff7f};
  return s[rng.uniform(0, 11)];
}

uint16_t nonfinite(Rng& rng) {
  return static_cast<uint16_t>((rng.uniform(0, 1) << 15) | (rng.chance(0.5) ? 0x7f80 : 0x7fc0));
}

uint16_t sign(Rng& rng, double v) { return to_bf16(rng.chance(0.5) ? v : -v); }

// A value of one of the group kinds that stress the encoders; `top` is the group's biased bf16
// exponent and `kv_scale` the per-tensor scale the values will be divided by.
uint16_t group_value(int kind, int64_t top, Rng& rng, float kv_scale) {
  switch (kind) {
    case 0: return bf16_bits(rng, top - rng.uniform(0, 2));   // one magnitude, any exponent
    case 1: return bf16_bits(rng, top - rng.uniform(0, 24));  // e4m3 subnormals under the max
    case 2: return rng.chance(0.5) ? 0x0000 : 0x8000;         // a zero group
    case 3: return sign(rng, kv_scale * 448 * rng.real(0.9, 1.1));        // fp8 saturation
    case 4: return sign(rng, kv_scale * std::ldexp(rng.real(0, 1), -5));  // fp8 subnormals
    case 5: return nonfinite(rng);                                        // nothing finite
    default: return to_bf16(std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-20, 20))));
  }
}

// One group of 64 values of a random kind, now and then a zero, subnormal, largest, inf or NaN.
void fill_group(uint16_t* x, Rng& rng, float kv_scale) {
  const int64_t top = rng.uniform(1, 254);
  const int kind = static_cast<int>(rng.uniform(0, 6));
  for (int d = 0; d < 64; ++d)
    x[d] = rng.chance(0.02) ? special(rng) : group_value(kind, top, rng, kv_scale);
}

void fill_rows(Rows& rows, Rng& rng, float kv_scale) {
  for (int64_t i = 0; i < rows.size(); ++i)
    for (int g = 0; g < 8; ++g) fill_group(rows.row(i) + g * 64, rng, kv_scale);
}

std::vector<int32_t> shuffled_slots(int64_t n, Rng& rng) {
  std::vector<int32_t> s(n);
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>(i);
  std::shuffle(s.begin(), s.end(), rng.engine());
  return s;
}

// Pages of 64 rows, packed (span 80, or one more 576-B unit), enough for n rows.
PoolShape pages_for(KvLayout layout, int64_t n) {
  return {.layout = layout,
          .num_blocks = (n + 63) / 64,
          .block_size = 64,
          .packed = layout == KvLayout::fp8_ds_mla ? 1 : 16};
}

// 65536 values, every bf16 code once, into each layout; per-tensor fp8 under scales that make
// the float quotient saturate, underflow to float subnormals, or round twice.
TEST(GpuQuantize, EveryBf16ValueMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  Rows rows(128);
  std::vector<uint16_t> codes(65536);
  for (int c = 0; c < 65536; ++c) codes[c] = static_cast<uint16_t>(c);
  std::shuffle(codes.begin(), codes.end(), rng.engine());  // fp8_ds_mla: mixed groups
  for (int64_t i = 0; i < 128; ++i) std::copy_n(codes.begin() + i * 512, 512, rows.row(i));
  const float random_scale = static_cast<float>(std::exp(rng.real(-20, 20)));
  for (KvLayout layout : kKvLayouts) {
    const HostTensor pool = poisoned_pool(pages_for(layout, 128));
    const std::vector<int32_t> slots = shuffled_slots(128, rng);
    for (float kv_scale : {1.0f, 0.5f, 3.0f, 1.0f / 448, 7.5e5f, 1e-30f, 1e30f, random_scale}) {
      EXPECT_TRUE(
          same_bytes(on_gpu(rows, slots, pool, kv_scale), on_cpu(rows, slots, pool, kv_scale)))
          << kv_layout_name(layout) << " kv_scale " << kv_scale << " " << seed_note(seed);
      if (layout != KvLayout::fp8_e4m3) break;  // kv_scale is unused
    }
  }
}

// Groups whose maxima are every positive finite bf16 (so every UE8M0 byte 0..247), the other
// values anywhere below the max (subnormal and zero e4m3 codes), now and then an infinity (a NaN
// makes its group NaN, byte 255: RandomPagesAndPaddingSlotsMatchTheCpu has such groups).
TEST(GpuQuantize, EveryUe8m0ExponentMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const Rows rows = rows_with_every_group_maximum(
      rng, 3,
      [&](uint16_t m) {
        return rng.chance(0.03)
                   ? static_cast<uint16_t>(0x7f80 | (rng.uniform(0, 1) << 15))
                   : static_cast<uint16_t>(rng.uniform(0, m) | (rng.uniform(0, 1) << 15));
      },
      [&] { return rng.chance(0.1) ? special(rng) : bf16_bits(rng, rng.uniform(0, 254)); });
  const int64_t n = rows.size();
  const HostTensor pool = poisoned_pool(pages_for(KvLayout::fp8_ds_mla, n));
  const std::vector<int32_t> slots = shuffled_slots(n, rng);
  EXPECT_TRUE(same_bytes(on_gpu(rows, slots, pool, 1.0f), on_cpu(rows, slots, pool, 1.0f)))
      << seed_note(seed);
}

// Random pools (packed pages, padded token strides, rank 4), a random subset of the slots in
// random order with padding slots among them, rows of extreme groups: the whole pool, page
// tails and other rows included, is the CPU's.
TEST(GpuQuantize, RandomPagesAndPaddingSlotsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (KvLayout layout : kKvLayouts)
    for (int round = 0; round < 8; ++round) {
      const uint64_t seed = fresh_seed();
      Rng rng(seed);
      const PoolShape shape = quantize_pool_shape(rng, layout, round);
      const HostTensor pool = poisoned_pool(shape);
      const std::vector<int32_t> slots = random_slots(rng, shape, 0.6);
      const float kv_scale = static_cast<float>(std::exp(rng.real(-8, 8)));
      Rows rows(static_cast<int64_t>(slots.size()), round % 3 == 0 ? 0 : round % 3 == 1 ? 64 : 3);
      fill_rows(rows, rng, kv_scale);
      EXPECT_TRUE(
          same_bytes(on_gpu(rows, slots, pool, kv_scale), on_cpu(rows, slots, pool, kv_scale)))
          << shape.describe() << " kv_scale " << kv_scale << " " << seed_note(seed);
    }
}

// Slots >= num_blocks * block_size: the CPU refuses them (host values are checked), the GPU
// cannot see them and skips their rows, writing what the CPU writes with those slots as padding.
TEST(GpuQuantize, SlotsPastThePoolAreSkipped) {
  SKIP_WITHOUT_GPU();
  for (KvLayout layout : kKvLayouts) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    PoolShape shape = random_pool_shape(rng, layout);
    shape.packed = layout == KvLayout::fp8_ds_mla ? 1 : 8;  // past the pool, not in a page tail
    const HostTensor pool = poisoned_pool(shape);
    const auto past = static_cast<int32_t>(shape.num_blocks * shape.block_size);
    std::vector<int32_t> slots = shuffled_slots(past, rng), as_padding = slots;
    for (size_t k = 0; k < slots.size(); k += 3) {
      const int32_t bad[] = {past, past + 1, past + static_cast<int32_t>(shape.block_size),
                             std::numeric_limits<int32_t>::max()};
      slots[k] = bad[k / 3 % 4];
      as_padding[k] = -1;
    }
    Rows rows(past);
    fill_rows(rows, rng, 1.0f);
    test::expect_smla_error([&] { on_cpu(rows, slots, pool, 1.0f); }, ErrorKind::value, "slots",
                            "slots in [0, num_blocks * block_size", "slots[");
    EXPECT_TRUE(same_bytes(on_gpu(rows, slots, pool, 1.0f), on_cpu(rows, as_padding, pool, 1.0f)))
        << shape.describe() << " " << seed_note(seed);
    const std::vector<int32_t> all_past(4, past);
    EXPECT_TRUE(same_bytes(on_gpu(Rows(4), all_past, pool, 1.0f), pool.bytes))
        << shape.describe() << ": only slots past the pool";
  }
}

// The call is one kernel on the given stream: it captures as one node, and the replay on a
// re-poisoned pool writes what the eager call wrote.
TEST(GpuQuantize, CapturesAsOneKernelNodeAndReplays) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const HostTensor host_pool = poisoned_pool(pages_for(KvLayout::fp8_ds_mla, 200));
  Rows rows(150, 64);
  fill_rows(rows, rng, 1.0f);
  std::vector<int32_t> slots = shuffled_slots(150, rng);
  slots[7] = -1;
  const OnDevice r(rows.t), s(i32_tensor(slots)), pool(host_pool);
  TestStream stream;
  quantize_kv(r.view, s.view, pool.view, 1.0f, stream.get());
  stream.synchronize();
  const std::vector<std::byte> eager = pool.bytes();
  ASSERT_TRUE(same_bytes(eager, on_cpu(rows, slots, host_pool, 1.0f))) << "seed " << seed;

  ASSERT_CUDA(cudaMemsetAsync(pool.memory.get(), 0xab, pool.memory.bytes(), stream.get()));
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  quantize_kv(r.view, s.view, pool.view, 1.0f, stream.get());
  ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  size_t count = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &count));
  ASSERT_EQ(count, 1u);
  cudaGraphNode_t node;
  CUDA_OK(cudaGraphGetNodes(graph, &node, &count));
  cudaKernelNodeParams params{};
  CUDA_OK(cudaGraphKernelNodeGetParams(node, &params));
  EXPECT_EQ(params.func, cuda::quantize_kernel());
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA(cudaGraphLaunch(exec, stream.get()));
  stream.synchronize();
  EXPECT_TRUE(same_bytes(pool.bytes(), eager)) << "replay";
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
}

// What the host can check is checked before the launch; no rows is no launch.
TEST(GpuQuantize, HostChecksComeFirst) {
  SKIP_WITHOUT_GPU();
  const HostTensor host_pool = poisoned_pool(pages_for(KvLayout::fp8_e4m3, 64));
  Rng rng(1);
  Rows rows(4);
  fill_rows(rows, rng, 1.0f);
  HostTensor host_slots = i32_tensor({0, 1, 2, 3});
  const OnDevice r(rows.t), s(host_slots), pool(host_pool);

  auto expect = [&](const TensorView& rv, const TensorView& sv, ErrorKind kind, const char* arg,
                    const std::string& got = "") {
    try {
      quantize_kv(rv, sv, pool.view, 1.0f);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(e.got().find(got), std::string::npos) << e.what();
    }
  };
  expect(r.view, host_view(host_slots), ErrorKind::type, "slots");  // host slots, device pool
  TensorView misaligned = r.view, three_slots = s.view;
  misaligned.data = static_cast<std::byte*>(misaligned.data) + 1;  // one byte into row 0
  misaligned.shape[0] = three_slots.shape[0] = 3;
  expect(misaligned, three_slots, ErrorKind::value, "rows",
         "an address 1 bytes past a multiple of 2");

  TensorView none = r.view, no_slots = s.view;
  none.shape[0] = no_slots.shape[0] = 0;
  quantize_kv(none, no_slots, pool.view, 1.0f);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bytes(pool.bytes(), host_pool.bytes));
}

}  // namespace
}  // namespace smla::test
