// Inputs the quantizer tests share (the CPU's against float64, the CUDA one's against the CPU):
// bf16 rows with padded strides, pools of one byte value, rows whose groups need every UE8M0 byte.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "case_gen.h"

namespace smla::test {

// bf16 rows [N, 512] lying 512 + `pad` elements apart (an odd pad: rows only 2-byte aligned),
// every element NaN until written, gaps included.
struct Rows {
  HostTensor t;
  explicit Rows(int64_t n, int64_t pad = 0)
      : t(HostTensor::make(DType::bf16, {n, 512}, {512 + pad, 1})) {
    for (size_t i = 0; i < t.bytes.size() / 2; ++i) t.set<uint16_t>(i, 0x7fc0);
  }
  int64_t size() const { return t.size(0); }
  uint16_t* row(int64_t i) { return reinterpret_cast<uint16_t*>(t.bytes.data()) + i * t.stride(0); }
  const uint16_t* row(int64_t i) const {
    return reinterpret_cast<const uint16_t*>(t.bytes.data()) + i * t.stride(0);
  }
};

// A random pool for round `round` of a quantizer test; round 0 always packs other data into
// its pages (fp8_ds_mla: 2 extra 576-B units; other layouts: a page twice the block).
inline PoolShape quantize_pool_shape(Rng& rng, KvLayout layout, int round) {
  PoolShape shape = random_pool_shape(rng, layout);
  if (round == 0) shape.packed = layout == KvLayout::fp8_ds_mla ? 2 : shape.block_size;
  return shape;
}

// A pool of `shape` whose every byte (page tails and packed slots too) is `fill`, so that a byte
// quantize_kv must not write shows.
inline HostTensor filled_pool(const PoolShape& shape, std::byte fill) {
  Rng unused_rng(0);
  Moments unused;
  HostTensor pool = make_pool(shape, unused_rng, CaseSpec{}, unused);
  std::fill(pool.bytes.begin(), pool.bytes.end(), fill);
  return pool;
}

// Rows whose 7 NoPE groups have as maxima every positive finite bf16 once, in random order, so
// that every UE8M0 byte a finite bf16 group can need (0..247) is chosen: each group's max `m` at a
// random place with a random sign, its other values below(m), the RoPE values rope().
template <class Below, class Rope>
Rows rows_with_every_group_maximum(Rng& rng, int64_t pad, const Below& below, const Rope& rope) {
  std::vector<uint16_t> maxima;
  for (uint16_t m = 0x0001; m <= 0x7f7f; ++m) maxima.push_back(m);
  std::shuffle(maxima.begin(), maxima.end(), rng.engine());
  Rows rows((static_cast<int64_t>(maxima.size()) + 6) / 7, pad);
  for (int64_t i = 0; i < rows.size(); ++i) {
    for (int g = 0; g < 7; ++g) {
      const size_t k = static_cast<size_t>(i * 7 + g);
      const uint16_t m = k < maxima.size() ? maxima[k] : 0x3f80;
      uint16_t* x = rows.row(i) + g * 64;
      for (int d = 0; d < 64; ++d) x[d] = below(m);
      x[rng.uniform(0, 63)] = static_cast<uint16_t>(m | (rng.chance(0.5) ? 0x8000 : 0));
    }
    for (int d = 448; d < 512; ++d) rows.row(i)[d] = rope();
  }
  return rows;
}

// Each real slot of `shape` with chance `keep`, plus 12 padding slots (-1, INT32_MIN, other
// negatives), shuffled.
inline std::vector<int32_t> random_slots(Rng& rng, const PoolShape& shape, double keep) {
  std::vector<int32_t> slots;
  for (int32_t s = 0; s < shape.num_blocks * shape.block_size; ++s)
    if (rng.chance(keep)) slots.push_back(s);
  for (int k = 0; k < 12; ++k)
    slots.push_back(k % 3 == 0   ? -1
                    : k % 3 == 1 ? std::numeric_limits<int32_t>::min()
                                 : -static_cast<int32_t>(rng.uniform(2, 99)));
  std::shuffle(slots.begin(), slots.end(), rng.engine());
  return slots;
}

}  // namespace smla::test
