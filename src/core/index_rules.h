// SPEC §4's per-token arithmetic, shared by the CPU builder and the CUDA kernel so that both
// write the same bits. Pure functions of values; where a value is out of range is each
// caller's business (the CPU throws, the GPU writes -1).
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace smla::rules {

// The request of token `t`: the last b < num_requests with start(b) <= t (binary search over
// the requests' first tokens, e.g. cum_seq_lens_q).
template <class Start>
SMLA_HOST_DEVICE inline int64_t request_of(int64_t t, int64_t num_requests, const Start& start) {
  int64_t lo = 0, hi = num_requests - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (start(mid) <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// request_of as a count that threads can share: for nondecreasing starts, the last
// b < num_requests with start(b) <= t is the number of b in [1, num_requests) with
// start(b) <= t. This counts those among b = first, first + step, ... (first >= 1), so the
// counts of first = 1 .. step sum to request_of; whatever the starts, that sum is a request.
template <class Start>
SMLA_HOST_DEVICE inline int64_t requests_started(int64_t t, int64_t first, int64_t step,
                                                 int64_t num_requests, const Start& start) {
  int64_t count = 0;
  for (int64_t b = first; b < num_requests; b += step) count += start(b) <= t;
  return count;
}

// The slot of position (or compressed entry) `pos` on page `page_id` of `rows_per_page` rows.
SMLA_HOST_DEVICE inline int64_t slot(int32_t page_id, int64_t rows_per_page, int64_t pos) {
  return int64_t{page_id} * rows_per_page + pos % rows_per_page;
}

// A slot's storage offset in pages of `block_size` rows spaced `span` rows apart. Negatives
// stay; an offset int32 cannot hold addresses no pool and becomes padding.
SMLA_HOST_DEVICE inline int32_t storage_offset(int64_t slot, int64_t block_size, int64_t span) {
  if (slot < 0) return static_cast<int32_t>(slot < INT32_MIN ? INT32_MIN : slot);
  const int64_t offset = slot / block_size * span + slot % block_size;
  return offset <= INT32_MAX ? static_cast<int32_t>(offset) : -1;
}

// storage_offset(slot(page_id, E, pos), E, span) for in_page = pos % E, without dividing:
// a page's slots start at page_id * E, its rows at page_id * span.
SMLA_HOST_DEVICE inline int32_t page_offset(int32_t page_id, int64_t in_page, int64_t E,
                                            int64_t span) {
  if (page_id < 0) return storage_offset(int64_t{page_id} * E + in_page, E, span);
  const int64_t offset = int64_t{page_id} * span + in_page;
  return offset <= INT32_MAX ? static_cast<int32_t>(offset) : -1;
}

// The storage offset of local top-k entry x on compressed page `page_id` (that of entry x,
// E entries a page); a negative entry is copied as it is.
SMLA_HOST_DEVICE inline int32_t topk_offset(int32_t x, int32_t page_id, int64_t E, int64_t span) {
  return x < 0 ? x : page_offset(page_id, x % E, E, span);
}

// Positions [start, end) a token's SWA columns hold: its causal window, or the DSpark window
// that every token of a draft block shares. Token `i` of a request of `q_len` tokens.
struct Window {
  int64_t start, end;
};
SMLA_HOST_DEVICE inline Window swa_window(int64_t seq_len, int64_t q_len, int64_t i, int window,
                                          bool dspark) {
  const int64_t first = dspark ? seq_len - q_len - window : seq_len - q_len + i - window + 1;
  return {first > 0 ? first : 0, dspark ? seq_len : seq_len - q_len + i + 1};
}

// Top-k entries a token reads: all of a decode token's (-1 padded), the first
// min((pos + 1) / ratio, top_k) of a prefill token's (none for a position before the first).
SMLA_HOST_DEVICE inline int64_t topk_used(bool decode, int64_t pos, int ratio, int64_t top_k) {
  if (decode) return top_k;
  const int64_t visible = pos < 0 ? 0 : (pos + 1) / ratio;
  return visible < top_k ? visible : top_k;
}

}  // namespace smla::rules
