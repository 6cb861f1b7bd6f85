// `smla`'s command line (tools/args.cpp) and its check (tools/oracle.cpp): the rows it samples,
// and a failure for any output value that is not finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "../tools/oracle.h"  // not tests/oracle.h
#include "smla/executor.h"
#include "synth.h"

namespace smla::cli {
namespace {

Invocation parse(std::initializer_list<const char*> words) {
  std::vector<const char*> argv{"smla"};
  argv.insert(argv.end(), words);
  return parse_args(static_cast<int>(argv.size()), argv.data());
}

// The command line is refused with exactly `message`.
void expect_usage_error(std::initializer_list<const char*> words, const std::string& message) {
  try {
    parse(words);
    ADD_FAILURE() << "taken; expected: " << message;
  } catch (const UsageError& e) {
    EXPECT_EQ(e.what(), message);
  }
}

TEST(RunArgs, HelpOnlyForKnownCommands) {
  EXPECT_EQ(parse({"help"}).command, Command::help);
  EXPECT_EQ(parse({"--help"}).command, Command::help);
  EXPECT_EQ(parse({"run", "--requests", "5x", "--help"}).command, Command::help);
  EXPECT_EQ(parse({"info", "-h"}).command, Command::help);
  expect_usage_error({"bogus", "--help"}, "unknown command 'bogus'");
  EXPECT_EQ(parse({"help", "run"}).command, Command::help);
  EXPECT_EQ(parse({"--help", "info"}).command, Command::help);
  expect_usage_error({"help", "extra"}, "help takes a command or nothing, got 'extra'");
  expect_usage_error({"help", "run", "extra"}, "help takes a command or nothing, got 'extra'");
  expect_usage_error({}, "no command");
}

TEST(RunArgs, KvLayoutNames) {
  EXPECT_EQ(parse({"run", "--kv", "fp8_e4m3"}).run.kv, KvLayout::fp8_e4m3);
  EXPECT_EQ(parse({"run", "--kv", "fp8"}).run.kv, KvLayout::fp8_e4m3);
  EXPECT_EQ(parse({"run", "--kv=fp8_ds_mla"}).run.kv, KvLayout::fp8_ds_mla);
  expect_usage_error({"run", "--kv", "e4m3"},
                     "--kv: expected bf16|fp8_e4m3|fp8|fp8_ds_mla, got 'e4m3'");
}

// Layer l is in SWA group l % groups: no more groups than the model has layers.
TEST(RunArgs, GroupsAtMostTheModelsLayers) {
  EXPECT_EQ(parse({"run", "--groups", "43"}).run.groups, 43);
  expect_usage_error({"run", "--groups", "44"},
                     "--groups: expected at most the 43 layers of v4-flash, got 44");
  expect_usage_error({"run", "--model", "v41-flash", "--groups", "41"},
                     "--groups: expected at most the 40 layers of v41-flash, got 41");
}

TEST(RunArgs, NumbersAreParsedStrictly) {
  for (const char* bad : {"1.5", "10abc", "-3", "0", "", " 5", "+5", "99999999999"})
    expect_usage_error({"run", "--requests", bad},
                       std::string("--requests: expected an integer in [1, 1073741824], got '") +
                           bad + "'");
  expect_usage_error({"run", "--requests"}, "--requests: missing value");
}

std::vector<Row> sample(int64_t tokens, int64_t heads, int count, uint64_t seed) {
  std::vector<float> storage(1);  // sample_rows reads the shape alone
  const TensorView query = make_view(storage.data(), DType::f32, Device{}, {tokens, heads, 512},
                                     {0, 0, 0});
  std::mt19937_64 rng(seed);
  return sample_rows(query, count, rng);
}

// --check N: N distinct rows, sorted, inside the query; every row once when N >= T * H.
TEST(CheckRows, DistinctSortedAndAllWhenAskedForMore) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int count : {1, 7, 63, 64}) {
    const std::vector<Row> rows = sample(8, 8, count, seed);
    ASSERT_EQ(rows.size(), static_cast<size_t>(count));
    EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
    EXPECT_EQ(std::set<Row>(rows.begin(), rows.end()).size(), rows.size()) << count;
    for (const Row& r : rows) {
      EXPECT_TRUE(r.token >= 0 && r.token < 8 && r.head >= 0 && r.head < 8) << r.token;
    }
  }
  const std::vector<Row> all = sample(3, 5, 1000, seed);
  ASSERT_EQ(all.size(), 15u);
  EXPECT_EQ(std::set<Row>(all.begin(), all.end()).size(), 15u);
}

// NaN compares false with every number, so it must not drop out of the check's error: a CPU
// step checks clean, then one value of a sampled row poisoned as NaN or +inf fails it.
TEST(CheckRows, OutputThatIsNotFiniteFails) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const RunOptions o{.requests = 2, .context = 300, .mtp = 2, .check = 0, .seed = seed};
  const auto specs = model_layers(model_preset(o.model), o.groups);
  const auto streams = make_streams(Device{});
  SynthStep step(o, specs, *streams);
  StepExecutor executor(step.device.layers, *streams, step.num_tokens, step.max_columns,
                        TableSharing::shared, o.compressed_index);
  executor.run_step(step.device.inputs, step.device.queries, step.device.outs);
  std::mt19937_64 rng(seed);
  const std::vector<Row> rows = sample_rows(step.host.queries[0], 4, rng);
  EXPECT_LT(check_layer(step.host, 0, rows).max_relative_error, 1e-2);
  const TensorView& out = step.host.outs[0];
  uint16_t* value = static_cast<uint16_t*>(out.data) + rows[1].token * out.strides[0] +
                    rows[1].head * out.strides[1] + 5 * out.strides[2];
  for (const uint16_t bits : {uint16_t{0x7fc0}, uint16_t{0x7f80}}) {  // bf16 NaN, +inf
    *value = bits;
    const CheckResult poisoned = check_layer(step.host, 0, rows);
    EXPECT_EQ(poisoned.max_relative_error, std::numeric_limits<double>::infinity()) << bits;
    EXPECT_FALSE(poisoned.max_relative_error <= 1e-2) << bits;
  }
}

}  // namespace
}  // namespace smla::cli
