// The float64 oracle of SPEC §2, written plainly from the spec and sharing no code with the
// library, plus what backend tests need around it: cases (case_gen.h), poisoning of rows that
// nothing attends, and the comparison of a backend's outputs with the oracle's.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "case_gen.h"
#include "headroom.h"
#include "host_case.h"
#include "ref_numeric.h"

namespace smla::test {

// A KV pool's geometry derived afresh from its tensor (SPEC §2, §4).
struct RefPool {
  const HostTensor* t = nullptr;
  bool ds_mla = false;
  int64_t blocks = 0, block_size = 0, span = 0, token_bytes = 0, block_bytes = 0;

  explicit RefPool(const HostTensor& pool) : t(&pool) {
    const int64_t elem = static_cast<int64_t>(dtype_size(pool.dtype));
    ds_mla = pool.dtype == DType::u8;
    blocks = pool.size(0);
    block_size = pool.size(1);
    block_bytes = pool.stride(0) * elem;
    token_bytes = ds_mla ? 576 : pool.stride(1) * elem;
    span = ds_mla ? block_size : pool.stride(0) / pool.stride(1);
  }
  bool valid(int64_t offset) const {
    return offset >= 0 && offset < blocks * span && offset % span < block_size;
  }
  // Byte offsets of a valid row's record and (fp8_ds_mla) of its 8 scale bytes.
  int64_t record(int64_t offset) const {
    return (offset / span) * block_bytes + (offset % span) * token_bytes;
  }
  int64_t scale_record(int64_t offset) const {
    return (offset / span) * block_bytes + block_size * 576 + (offset % span) * 8;
  }
  // The 512 dequantized values of a valid row.
  std::array<double, 512> row(int64_t offset) const {
    std::array<double, 512> v{};
    const int64_t at = record(offset);
    if (!ds_mla) {
      for (int d = 0; d < 512; ++d)
        v[d] = t->dtype == DType::bf16 ? ref_bf16(t->load<uint16_t>(at + 2 * d))
                                       : ref_e4m3(t->load<uint8_t>(at + d));
      return v;
    }
    const int64_t scales = scale_record(offset);
    for (int d = 0; d < 448; ++d)
      v[d] = ref_e4m3(t->load<uint8_t>(at + d)) * ref_ue8m0(t->load<uint8_t>(scales + d / 64));
    for (int d = 0; d < 64; ++d) v[448 + d] = ref_bf16(t->load<uint16_t>(at + 448 + 2 * d));
    return v;
  }
};

struct AttendedRow {
  bool compressed;  // read from compressed_kv_cache (which, when absent, is swa_kv_cache)
  int64_t offset;
};

// S(t) of every token t: the attended rows in column order (rules 1-3 of SPEC §2).
inline std::vector<std::vector<AttendedRow>> attended_rows(const DecodeCase& c) {
  const RefPool swa(c.swa_kv_cache);
  const RefPool compressed(c.compressed_kv_cache.defined() ? c.compressed_kv_cache
                                                           : c.swa_kv_cache);
  const int64_t T = c.query.size(0), K = c.sparse_indices.size(1), B = c.seq_lens.size(0);
  std::vector<std::vector<AttendedRow>> rows(T);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t begin = c.cum_seq_lens_q.defined() ? c.cum_seq_lens_q.get<int32_t>(b) : b;
    const int64_t end = c.cum_seq_lens_q.defined() ? c.cum_seq_lens_q.get<int32_t>(b + 1) : b + 1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = c.seq_lens.get<int32_t>(b) - (end - begin) + (t - begin);
      const int64_t swa_len = std::min<int64_t>(pos + 1, c.window);
      const int64_t len = c.sparse_topk_lens.get<int32_t>(t);
      for (int64_t col = 0; col < K; ++col) {
        const int64_t offset = c.sparse_indices.get<int32_t>(t * K + col);
        const bool in_compressed = col >= c.window;
        const bool attended = col < len && (in_compressed || col < swa_len) &&
                              (in_compressed ? compressed : swa).valid(offset);
        if (attended) rows[t].push_back({in_compressed, offset});
      }
    }
  }
  return rows;
}

// make_case(spec, seed) if `wanted(case)`, else the first case of seed + 1, seed + 2, ... that
// it is: for a test that a rare draw would leave vacuous. The case's seed and summary name the
// seed used; replaying either seed gives the same case.
template <class Wanted>
DecodeCase make_case_where(const CaseSpec& spec, uint64_t seed, Wanted wanted) {
  for (;; ++seed)
    if (DecodeCase c = make_case(spec, seed); wanted(c)) return c;
}

// A case where some token attends a row (each of a few tokens has an empty S(t) about one time
// in twenty, all of them about one seed in 10^4), for a test that needs one: a NaN put into an
// attended row.
inline DecodeCase make_attending_case(const CaseSpec& spec, uint64_t seed) {
  return make_case_where(spec, seed, [](const DecodeCase& c) {
    for (const std::vector<AttendedRow>& rows : attended_rows(c))
      if (!rows.empty()) return true;
    return false;
  });
}

struct Reference {
  int64_t tokens = 0;
  int heads = 0, out_heads = 0;
  std::vector<double> out;  // [T, H_out, 512]
  std::vector<double> lse;  // [T, H]
  // [T, H]: the row's largest sum of |bmm1_scale q_d k_d| over its keys. A float score's
  // rounding follows its terms' magnitude, not their sum: wide scores near a small lse.
  std::vector<double> lse_terms;
};

inline Reference oracle(const DecodeCase& c) {
  const RefPool swa(c.swa_kv_cache);
  const RefPool compressed(c.compressed_kv_cache.defined() ? c.compressed_kv_cache
                                                           : c.swa_kv_cache);
  Reference r;
  r.tokens = c.query.size(0);
  r.heads = static_cast<int>(c.query.size(1));
  r.out_heads = static_cast<int>(c.out.size(1));
  r.out.assign(r.tokens * r.out_heads * 512, 0.0);
  r.lse.assign(r.tokens * r.heads, -std::numeric_limits<double>::infinity());
  r.lse_terms.assign(r.tokens * r.heads, 0.0);
  const auto all = attended_rows(c);
  for (int64_t t = 0; t < r.tokens; ++t) {
    std::vector<std::array<double, 512>> k;
    for (const AttendedRow& a : all[t])
      k.push_back((a.compressed ? compressed : swa).row(a.offset));
    for (int h = 0; h < r.heads; ++h) {
      if (k.empty()) continue;  // output 0, lse -inf
      const int64_t q_at = t * c.query.stride(0) + h * c.query.stride(1);
      std::array<double, 512> q;
      for (int d = 0; d < 512; ++d)
        q[d] = c.query.dtype == DType::bf16 ? ref_bf16(c.query.get<uint16_t>(q_at + d))
                                            : ref_e4m3(c.query.get<uint8_t>(q_at + d));
      std::vector<double> s;
      double terms = 0;  // the largest sum of |terms| of a score
      for (const auto& row : k) {
        double dot = 0, magnitude = 0;
        for (int d = 0; d < 512; ++d) {
          dot += q[d] * row[d];
          magnitude += std::abs(q[d] * row[d]);
        }
        s.push_back(static_cast<double>(c.bmm1_scale) * dot);
        terms = std::max(terms, std::abs(static_cast<double>(c.bmm1_scale)) * magnitude);
      }
      const double m_s = *std::max_element(s.begin(), s.end());
      double l = 0;
      for (double x : s) l += std::exp(x - m_s);
      r.lse[t * r.heads + h] = m_s + std::log(l);
      r.lse_terms[t * r.heads + h] = terms;

      const double sink =
          c.sinks.defined() ? c.sinks.get<float>(h) : -std::numeric_limits<double>::infinity();
      if (sink == std::numeric_limits<double>::infinity()) continue;  // output 0
      const double m = std::max(m_s, sink);
      double denom = std::exp(sink - m);
      std::array<double, 512> acc{};
      for (size_t j = 0; j < k.size(); ++j) {
        const double p = std::exp(s[j] - m);
        denom += p;
        for (int d = 0; d < 512; ++d) acc[d] += p * k[j][d];
      }
      for (int d = 0; d < 512; ++d)
        r.out[(t * r.out_heads + h) * 512 + d] = static_cast<double>(c.bmm2_scale) * acc[d] / denom;
    }
  }
  return r;
}

// Fills every real pool row that no attended column points to with NaN and Inf (in values and,
// for fp8_ds_mla, in scales): SPEC §2 says such rows must not reach the output.
inline void poison_unattended_rows(DecodeCase& c) {
  std::set<int64_t> used[2];
  const bool shared = !c.compressed_kv_cache.defined();
  for (const auto& token : attended_rows(c))
    for (const AttendedRow& a : token) used[a.compressed && !shared].insert(a.offset);
  for (int which = 0; which < (shared ? 1 : 2); ++which) {
    HostTensor& t = which ? c.compressed_kv_cache : c.swa_kv_cache;
    const RefPool pool(t);
    for (int64_t o = 0; o < pool.blocks * pool.span; ++o) {
      if (!pool.valid(o) || used[which].count(o)) continue;
      const int64_t at = pool.record(o);
      if (t.dtype == DType::bf16) {
        for (int d = 0; d < 512; ++d) t.store<uint16_t>(at + 2 * d, d % 2 ? 0x7f80 : 0xffc1);
      } else {
        for (int d = 0; d < (pool.ds_mla ? 448 : 512); ++d) t.store<uint8_t>(at + d, 0x7f);
      }
      if (!pool.ds_mla) continue;
      for (int d = 0; d < 64; ++d) t.store<uint16_t>(at + 448 + 2 * d, d % 2 ? 0xff80 : 0x7fc0);
      for (int g = 0; g < 8; ++g) t.store<uint8_t>(pool.scale_record(o) + g, 0xff);
    }
  }
}

// |got - ref| <= out_rtol * |ref| + out_atol * max |ref| over the element's 64-dim group of its
// (token, head) row (fp8_ds_mla's scale groups: a group under a large scale no longer sets the
// bound of the others, nor the NoPE groups that of the RoPE one) + 2^-134, half the spacing of
// bf16's subnormals, where rounding to bf16 has that absolute error whatever the relative bound;
// |lse_got - lse_ref| <= lse_tol * max(1, |lse_ref|) + lse_terms_tol * Reference::lse_terms (the
// sums' rounding follows their terms: for float sums four ulps of them, 2^-22: 1.3e-5 off an lse
// of 0.56 whose scores' terms summed 1514, seventy-sixth session). NaN is never accepted; zero rows
// (padded heads, empty S(t), sink +inf) must be exactly zero and an empty lse exactly -inf.
struct Tolerance {
  double out_rtol, out_atol, lse_tol, lse_terms_tol;
  const char* name;  // the headroom table's (headroom.h)
  // The CPU backend: bf16 rounding of the output plus float32 dot products.
  static Tolerance reference() { return {1.0 / 256, 1e-5, 1e-5, 0x1p-22, "reference"}; }
  // A kernel with lower-precision products. fp8 rows with a bf16 query become bf16 exactly on
  // load and then run the bf16 arithmetic, so they take bf16's bounds. An e4m3 query's scores
  // are e4m3 wgmma (sums of about 14 bits) and its P f16. Measured on an H200 (seventy-fourth
  // session, every GPU test, SMLA_TEST_HEADROOM): outputs reached 0.62 of the bf16 bound and
  // 0.34 of an e4m3 one of 3e-2, lse 0.0022 of a bf16 one of 1e-3 and 0.26 of an e4m3 one of
  // 1e-2; so these bounds, 1.6-4.5x above what was reached. The e4m3 sums' rounding follows
  // their terms, not the lse: on an H100 (eighty-first session) a row of lse -0.495, whose
  // largest score's terms summed 29.95, was 5.01e-3 off, 1.67e-4 (2^-12.6) of its terms, past the
  // 5e-3 alone; with 2^-12 of the terms its bound is 2.5x that error.
  static Tolerance device(DType query) {
    return query == DType::f8e4m3 ? Tolerance{2e-2, 2e-2, 5e-3, 0x1p-12, "device(f8e4m3)"}
                                  : Tolerance{1e-2, 1e-2, 1e-5, 0x1p-22, "device(bf16)"};
  }
};

inline std::string fmt(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

// Compares c.out and c.lse (as the backend left them) with the oracle.
inline ::testing::AssertionResult matches(const DecodeCase& c, const Reference& r, Tolerance tol) {
  std::ostringstream bad;
  int64_t mismatches = 0;
  auto report = [&](const std::string& what) {
    if (mismatches++ < 8) bad << "\n  " << what;
  };
  HeadroomRatios headroom;
  std::string worst_element;  // where headroom.group came from
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int h = 0; h < r.out_heads; ++h) {
      const double* ref = &r.out[(t * r.out_heads + h) * 512];
      double row_scale = 0, group_scale[8] = {};
      for (int d = 0; d < 512; ++d)
        group_scale[d / 64] = std::max(group_scale[d / 64], std::abs(ref[d]));
      for (double g : group_scale) row_scale = std::max(row_scale, g);
      const int64_t at = t * c.out.stride(0) + h * c.out.stride(1);
      for (int d = 0; d < 512; ++d) {
        const double got = ref_bf16(c.out.get<uint16_t>(at + d));
        const auto bound_over = [&](double scale) {  // 2^-134: bf16 subnormals' half spacing
          return tol.out_rtol * std::abs(ref[d]) + tol.out_atol * scale + 0x1p-134;
        };
        const auto element = [&] {
          return "out[" + std::to_string(t) + "," + std::to_string(h) + "," + std::to_string(d) +
                 "] = " + fmt(got) + ", oracle " + fmt(ref[d]);
        };
        const double bound = bound_over(group_scale[d / 64]);
        const double error = std::abs(got - ref[d]);
        if (const double ratio = headroom_ratio(error, bound); ratio > headroom.group) {
          headroom.group = ratio;
          worst_element = element() + ", group max " + fmt(group_scale[d / 64]);
        }
        headroom.row = std::max(headroom.row, headroom_ratio(error, bound_over(row_scale)));
        ++headroom.elements;
        if (!(error <= bound)) report(element() + (h >= r.heads ? " (padded head)" : ""));
      }
    }
  if (c.lse.defined())
    for (int64_t t = 0; t < r.tokens; ++t)
      for (int h = 0; h < r.heads; ++h) {
        const double ref = r.lse[t * r.heads + h];
        const double got = c.lse.get<float>(t * c.lse.stride(0) + h * c.lse.stride(1));
        const double error = std::abs(got - ref),
                     bound = tol.lse_tol * std::max(1.0, std::abs(ref)) +
                             tol.lse_terms_tol * r.lse_terms[t * r.heads + h];
        const bool ok = std::isinf(ref) ? got == ref : error <= bound;
        if (!std::isinf(ref)) headroom.lse = std::max(headroom.lse, headroom_ratio(error, bound));
        if (!ok)
          report("lse[" + std::to_string(t) + "," + std::to_string(h) + "] = " + fmt(got) +
                 ", oracle " + fmt(ref));
      }
  const char* layout = c.swa_kv_cache.dtype == DType::u8       ? "fp8_ds_mla"
                       : c.swa_kv_cache.dtype == DType::f8e4m3 ? "fp8_e4m3"
                                                               : "bf16";
  headroom.group_case = worst_element + " in " + c.summary;
  Headroom::record(
      std::string(tol.name) + " " + layout + " cache, " + dtype_name(c.query.dtype) + " query",
      headroom);
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " mismatches; " << c.summary << bad.str();
}

}  // namespace smla::test
