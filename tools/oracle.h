// The check of `smla run`: SPEC §2 in float64 for sampled (token, head) rows, attending what
// the synthetic step's block tables and top-k say directly (not the library's tables).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "synth.h"

namespace smla::cli {

struct CheckResult {
  int64_t rows = 0;
  double max_error = 0;           // max |out - oracle| over the rows' 512 values
  double max_relative_error = 0;  // the same, over the row's largest |oracle| value
  bool every_row = false;         // the layers had no more rows than asked for
};

// `count` distinct random (token, head) rows of a query [T, H, 512], sorted; every row when
// count >= T * H.
std::vector<Row> sample_rows(const TensorView& query, int count, std::mt19937_64& rng);

// The rows of layer `index` of `host` (those rows of its out already on the host), over the
// CPU backend's threads (SMLA_NUM_THREADS).
CheckResult check_layer(const StepData& host, size_t index, const std::vector<Row>& rows);

void merge(CheckResult& into, const CheckResult& more);

}  // namespace smla::cli
