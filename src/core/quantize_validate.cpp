// Argument checks of quantize_kv. Slot values are checked only for host tensors: device memory
// cannot be read without a synchronisation (a device quantizer must skip what it cannot write).
#include <algorithm>
#include <bit>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/quantize_problem.h"

namespace smla {
namespace {

using check::fail;
using check::num;
using check::shape_of;

std::string item(int64_t i, int64_t value) { return check::item("slots", i, value); }

// Every slot inside the pool's real rows or negative, and no slot written twice (the result
// would depend on the order of the writes).
void check_slot_values(const TensorView& slots, const QuantizeProblem& p) {
  std::vector<std::pair<int32_t, int64_t>> used;  // (slot, i)
  // Past the pool's slots the second write of one fails below: a broadcast view of 2^31 padding
  // rows took 32 GiB here and threw std::bad_alloc.
  used.reserve(size_t(std::min<int64_t>(p.num_rows, p.pool.slots() + 1)));
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const int32_t slot = check::at(slots, i);
    if (slot >= p.pool.slots())
      fail(ErrorKind::value, "slots",
           "slots in [0, num_blocks * block_size = " + num(p.pool.slots()) +
               ") or negative (padding)",
           item(i, slot));
    if (slot >= 0) used.emplace_back(slot, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t k = 1; k < used.size(); ++k)
    if (used[k].first == used[k - 1].first)
      fail(ErrorKind::value, "slots", "distinct slots (each written once)",
           item(used[k - 1].second, used[k].first) + " and " + item(used[k].second, used[k].first));
}

}  // namespace

QuantizeProblem validate_quantize(const TensorView& rows, const TensorView& slots,
                                  const TensorView& pool, float kv_scale) {
  QuantizeProblem p;
  p.pool = make_pool(pool, "pool");
  p.device = pool.device;
  check::tensor(rows, "rows", DType::bf16, p.device, {-1, kHeadDim},
                "[N, 512] (448 NoPE + 64 RoPE)");
  check::memory(rows, "rows");
  p.num_rows = rows.size(0);
  check::tensor(slots, "slots", DType::i32, p.device, {p.num_rows},
                "[N = " + num(p.num_rows) + "] (N = rows.size(0))");
  // On its bits: a float compare reads a subnormal as 0 where the caller flushes subnormals.
  if (const uint32_t bits = std::bit_cast<uint32_t>(kv_scale); bits == 0 || bits > 0x7f7fffffu)
    fail(ErrorKind::value, "kv_scale", "a finite float > 0", check::real(kv_scale));
  p.kv_scale = kv_scale;
  const TensorView records = pool_records(pool, p.pool);
  check::all_apart({{pool, "pool"}}, {{rows, "rows"}, {slots, "slots"}});
  check::all_apart({{records, "pool"}}, {{rows, "rows"}, {slots, "slots"}});
  if (p.device.kind == DeviceKind::cpu) check_slot_values(slots, p);
  return p;
}

}  // namespace smla
