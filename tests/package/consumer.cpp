// Links the installed smla::smla and runs one decode on the CPU: a token attending one row
// gets that row back (softmax weight 1) in every head, and its score as LSE. Exit 0 if so.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "smla/decode.h"
#include "smla/error.h"
#include "smla/executor.h"  // std::span: compiles only with the C++20 that smla::smla brings

int main() {
  using namespace smla;
  constexpr int H = 3, kBlockSize = 16, kRow = 5;
  std::vector<uint16_t> pool(kBlockSize * kHeadDim), query(H * kHeadDim, 0x3f80);  // q = 1
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint16_t>(0x3c00 + i % 97);
  std::vector<int32_t> indices(kWindow, -1), lens = {1}, seq_lens = {1};
  indices[0] = kRow;
  std::vector<uint16_t> out(H * kHeadDim, 0xffff);  // NaN: a head left unwritten fails
  std::vector<float> lse(H, NAN);
  DecodeArgs a;
  a.query = make_view(query.data(), DType::bf16, Device{}, {1, H, kHeadDim});
  a.swa_kv_cache = make_view(pool.data(), DType::bf16, Device{}, {1, kBlockSize, kHeadDim});
  a.sparse_indices = make_view(indices.data(), DType::i32, Device{}, {1, kWindow});
  a.sparse_topk_lens = make_view(lens.data(), DType::i32, Device{}, {1});
  a.seq_lens = make_view(seq_lens.data(), DType::i32, Device{}, {1});
  a.bmm1_scale = 1.f / 64;
  a.out = make_view(out.data(), DType::bf16, Device{}, {1, H, kHeadDim});
  a.lse = make_view(lse.data(), DType::f32, Device{}, {1, H});
  try {
    sparse_mla_decode(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  double score = 0;
  for (int d = 0; d < kHeadDim; ++d) {
    const uint32_t bits = uint32_t{pool[kRow * kHeadDim + d]} << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    score += x;
  }
  score /= 64;
  for (int h = 0; h < H; ++h) {
    for (int d = 0; d < kHeadDim; ++d)
      if (out[h * kHeadDim + d] != pool[kRow * kHeadDim + d]) {
        std::fprintf(stderr, "head %d dim %d: %#x, expected %#x\n", h, d, out[h * kHeadDim + d],
                     pool[kRow * kHeadDim + d]);
        return 1;
      }
    if (!(std::abs(lse[h] - score) <= 1e-4 * std::abs(score))) {
      std::fprintf(stderr, "head %d: lse %g, expected %g\n", h, lse[h], score);
      return 1;
    }
  }
  std::puts("ok");
  return 0;
}
